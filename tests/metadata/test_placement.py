"""Replica placement: distinct brokers per partition, Liftbridge's replication-factor rules, load spreading."""

from __future__ import annotations

import contextlib

import pytest

from tidelog.metadata.placement import PendingPlacements, place_replicas, rack_order, resolve_replication_factor
from tidelog.metadata.records import PartitionRecord
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.protocol.errors import InvalidArgumentError


@pytest.mark.parametrize(
    ("requested", "brokers", "expected"),
    [(0, 3, 1), (1, 3, 1), (3, 3, 3), (-1, 3, 3), (-1, 1, 1)],
)
def test_resolve_replication_factor(requested: int, brokers: int, expected: int) -> None:
    assert resolve_replication_factor(requested, brokers) == expected


@pytest.mark.parametrize(("requested", "brokers"), [(4, 3), (2, 1), (-2, 3), (-7, 3)])
def test_resolve_replication_factor_refuses(requested: int, brokers: int) -> None:
    with pytest.raises(InvalidArgumentError):
        resolve_replication_factor(requested, brokers)


def test_replicas_are_on_distinct_brokers_and_leaders_rotate() -> None:
    brokers = ["b", "c", "a"]
    placed = place_replicas(brokers, partitions=6, replication_factor=2)
    assert len(placed) == 6
    assert all(len(set(replicas)) == 2 and set(replicas) <= set(brokers) for replicas in placed)
    leaders = [replicas[0] for replicas in placed]
    assert sorted(leaders) == ["a", "a", "b", "b", "c", "c"]  # preferred leaders spread evenly
    assert place_replicas(brokers, 6, 2) == placed  # deterministic whatever the input order


def test_every_broker_holds_a_replica_when_rf_is_the_cluster_size() -> None:
    placed = place_replicas(["a", "b", "c"], partitions=3, replication_factor=3)
    assert all(sorted(replicas) == ["a", "b", "c"] for replicas in placed)
    assert sorted(replicas[0] for replicas in placed) == ["a", "b", "c"]


def test_placement_starts_on_the_least_loaded_broker() -> None:
    assert place_replicas(["a", "b", "c"], 1, 1, load={"a": 5, "b": 1, "c": 3}) == [("b",)]
    assert place_replicas(["a", "b", "c"], 1, 1, load={"a": 2, "b": 2, "c": 2}) == [("a",)]  # ties: first
    assert place_replicas(["a", "b", "c"], 1, 1, load={"a": 1}) == [("b",)]  # missing means none


def test_streams_created_one_after_another_spread_their_leaders() -> None:
    brokers = ["a", "b", "c"]
    load: dict[str, int] = {}
    leaders = []
    for _ in range(3):
        (replicas,) = place_replicas(brokers, 1, 1, load)
        leaders.append(replicas[0])
        for broker in replicas:
            load[broker] = load.get(broker, 0) + 1
    assert sorted(leaders) == brokers


def test_more_replicas_than_brokers_is_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        place_replicas(["a", "b"], 1, 3)


def test_streams_spread_their_preferred_leaders_when_every_broker_holds_every_partition() -> None:
    brokers = ["b0", "b1", "b2"]
    leaders: dict[str, int] = {}
    firsts = []
    for _ in range(3):
        (replicas,) = place_replicas(brokers, 1, 3, {b: 1 for b in brokers}, leaders)
        firsts.append(replicas[0])
        leaders[replicas[0]] = leaders.get(replicas[0], 0) + 1
    assert sorted(firsts) == brokers


# ---- racks ----


def test_replicas_spread_across_racks() -> None:
    racks = {"a1": "a", "a2": "a", "b1": "b", "b2": "b", "c1": "c", "c2": "c"}
    placed = place_replicas(sorted(racks), partitions=6, replication_factor=3, racks=racks)
    assert all(sorted(racks[r] for r in replicas) == ["a", "b", "c"] for replicas in placed), placed
    assert sorted(replicas[0] for replicas in placed) == sorted(racks)  # leaders still one per broker


def test_a_rack_is_used_twice_only_when_there_are_fewer_racks_than_replicas() -> None:
    racks = {"a1": "a", "a2": "a", "a3": "a", "b1": "b"}
    placed = place_replicas(sorted(racks), partitions=4, replication_factor=2, racks=racks)
    assert all({racks[r] for r in replicas} == {"a", "b"} for replicas in placed), placed
    three = place_replicas(sorted(racks), partitions=4, replication_factor=3, racks=racks)
    assert all(len(set(replicas)) == 3 and "b" in {racks[r] for r in replicas} for replicas in three), three


def test_brokers_without_a_rack_are_placed_as_before() -> None:
    brokers = ["a", "b", "c", "d"]
    assert place_replicas(brokers, 4, 3, racks={}) == place_replicas(brokers, 4, 3)
    assert place_replicas(brokers, 4, 2) == [("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")]
    assert rack_order(brokers, {"a": "x", "b": "x", "c": "y"}) == ["d", "a", "c", "b"]  # "" first, then x, y


# ---- placements not yet written ----


def test_pending_placements_count_until_the_snapshot_shows_them() -> None:
    brokers = [f"b{i}" for i in range(10)]
    book = PendingPlacements()
    empty = MetadataSnapshot()
    leaders = []
    with contextlib.ExitStack() as held:
        for n in range(8):  # eight creations decided before any is written
            load, lead = book.load(empty)
            (replicas,) = place_replicas(brokers, 1, 1, load, lead)
            held.enter_context(book.hold(f"s{n}", 0, [replicas]))
            leaders.append(replicas[0])
        assert len(set(leaders)) == 8, leaders
        written = MetadataSnapshot(partitions={("s0", 0): PartitionRecord("s0", 0, ("b0",), "b0", ("b0",))})
        assert book.load(written)[1] == {b: 1 for b in leaders}  # s0 counted once: from the snapshot
    assert len(book) == 0 and book.load(empty) == ({}, {})
