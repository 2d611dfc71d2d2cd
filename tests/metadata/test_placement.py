"""Replica placement: distinct brokers per partition, Liftbridge's replication-factor rules, load spreading."""

from __future__ import annotations

import pytest

from tidelog.metadata.placement import place_replicas, resolve_replication_factor
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
