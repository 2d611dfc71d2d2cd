"""Replica placement: which brokers hold each partition of a new stream (or of partitions added to one), and
which one leads.

Replicas go on distinct brokers. Partitions are laid out round-robin from a starting broker chosen to be the one
that is the preferred leader (first replica) of the fewest partitions already, then the one holding the fewest
replicas, so streams created one after another spread their leaders and their load across the cluster instead
of piling onto the alphabetically first broker (with a replication factor equal to the number of brokers every
broker holds every partition, and only the leader count tells them apart).

**Racks.** Brokers may name their rack (the broker setting ``rack``). The round robin then walks the brokers
interleaved by rack (the first broker of each rack, then the second of each, ...), and each partition's followers
are taken from racks its replicas do not use yet before a rack is used twice, so a partition survives the loss
of a whole rack whenever the replication factor is at most the number of racks. Brokers without a rack form one
rack of their own (named ``""``); with no racks at all the layout is the plain round robin.

**Placements not yet written.** The load is read from the metadata snapshot, which does not hold the placements
of creations still being written: eight streams created at once would all see the same load and start on the
same broker. :class:`PendingPlacements` holds every placement from the moment it is decided until the snapshot
shows it, and :meth:`PendingPlacements.load` counts them with the rest.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from tidelog.metadata.records import PartitionRecord
from tidelog.metadata.shared_map import SharedMap
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.protocol.errors import InvalidArgumentError


def resolve_replication_factor(requested: int, live_brokers: int) -> int:
    """Liftbridge's rules: 0 means 1, -1 means every broker; more than the live brokers is an error."""
    if requested == 0:
        requested = 1
    if requested == -1:
        requested = live_brokers
    if requested < 1:
        raise InvalidArgumentError(f"replicationFactor must be -1, 0 or positive, not {requested}")
    if requested > live_brokers:
        raise InvalidArgumentError(
            f"replicationFactor {requested} needs {requested} brokers but {live_brokers} "
            f"{'is' if live_brokers == 1 else 'are'} alive"
        )
    return requested


def rack_order(brokers: Iterable[str], racks: Mapping[str, str]) -> list[str]:
    """``brokers`` interleaved by rack: the first of each rack (racks by name), then the second of each, ..."""
    by_rack: dict[str, list[str]] = {}
    for broker in sorted(brokers):
        by_rack.setdefault(racks.get(broker, ""), []).append(broker)
    columns = [by_rack[rack] for rack in sorted(by_rack)]
    return [broker for row in itertools.zip_longest(*columns) for broker in row if broker is not None]


def place_replicas(
    brokers: Sequence[str],
    partitions: int,
    replication_factor: int,
    load: Mapping[str, int] | None = None,
    leaders: Mapping[str, int] | None = None,
    racks: Mapping[str, str] | None = None,
) -> list[tuple[str, ...]]:
    """Replica lists for ``partitions`` partitions; the first replica of each is its preferred leader.

    ``leaders`` counts the partitions each broker is already the preferred leader of, ``load`` the replicas it
    already holds, ``racks`` names each broker's rack (the module docstring)."""
    if replication_factor > len(brokers):
        raise InvalidArgumentError(f"cannot place {replication_factor} replicas on {len(brokers)} brokers")
    racks = racks or {}
    ordered = rack_order(brokers, racks)
    load = load or {}
    leaders = leaders or {}
    start = min(range(len(ordered)), key=lambda i: (leaders.get(ordered[i], 0), load.get(ordered[i], 0), i))
    placements: list[tuple[str, ...]] = []
    for p in range(partitions):
        first = (start + p) % len(ordered)
        ring = [ordered[(first + step) % len(ordered)] for step in range(len(ordered))]
        chosen = [ring[0]]
        used = {racks.get(ring[0], "")}
        for broker in ring[1:]:  # first, racks not used yet
            if len(chosen) < replication_factor and racks.get(broker, "") not in used:
                chosen.append(broker)
                used.add(racks.get(broker, ""))
        for broker in ring[1:]:  # then any broker, in ring order
            if len(chosen) < replication_factor and broker not in chosen:
                chosen.append(broker)
        placements.append(tuple(chosen))
    return placements


def placement_load(partitions: Iterable[PartitionRecord]) -> tuple[dict[str, int], dict[str, int]]:
    """What :func:`place_replicas` weighs: the replicas each broker holds, and the partitions it is the preferred
    leader (first replica) of."""
    load: dict[str, int] = {}
    leaders: dict[str, int] = {}
    _count((p.replicas for p in partitions), load, leaders)
    return load, leaders


def _count(placements: Iterable[Sequence[str]], load: dict[str, int], leaders: dict[str, int]) -> None:
    for replicas in placements:
        if replicas:
            leaders[replicas[0]] = leaders.get(replicas[0], 0) + 1
        for broker in replicas:
            load[broker] = load.get(broker, 0) + 1


class PendingPlacements:
    """Placements decided but not yet in the metadata snapshot (the module docstring). One per broker; only the
    controller's is ever used, since it places every partition."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[str, int, list[tuple[str, ...]]]] = {}  # token → (stream, first id, placements)
        self._tokens = itertools.count()
        self._shard_loads: dict[int, tuple[Mapping[Any, PartitionRecord], dict[str, int], dict[str, int]]] = {}

    def load(self, snapshot: MetadataSnapshot) -> tuple[dict[str, int], dict[str, int]]:
        """:func:`placement_load` of the snapshot's partitions and of the held placements it does not show yet."""
        load, leaders = self._snapshot_load(snapshot.partitions)
        for stream, first, placements in self._held.values():
            if snapshot.partition(stream, first) is None:
                _count(placements, load, leaders)
        return load, leaders

    def _snapshot_load(self, partitions: Mapping[Any, PartitionRecord]) -> tuple[dict[str, int], dict[str, int]]:
        """:func:`placement_load` of ``partitions``; of a :class:`SharedMap`, counted again only in the shards
        that changed since the last call (a creation costs what changed, not the cluster's size)."""
        if not isinstance(partitions, SharedMap):
            return placement_load(partitions.values())
        load: dict[str, int] = {}
        leaders: dict[str, int] = {}
        kept: dict[int, tuple[Mapping[Any, PartitionRecord], dict[str, int], dict[str, int]]] = {}
        for shard in partitions.shards():
            found = self._shard_loads.get(id(shard))
            if found is None or found[0] is not shard:
                found = (shard, *placement_load(shard.values()))
            kept[id(shard)] = found  # holding the shard keeps its id from being reused by another
            for total, counts in ((load, found[1]), (leaders, found[2])):
                for broker, n in counts.items():
                    total[broker] = total.get(broker, 0) + n
        self._shard_loads = kept
        return load, leaders

    @contextmanager
    def hold(self, stream: str, first: int, placements: Sequence[tuple[str, ...]]) -> Iterator[None]:
        """Count ``placements`` (partitions ``first``, ``first + 1``, ... of ``stream``) while the block runs:
        enter it before the first await after deciding them, so no other placement decides without them."""
        token = next(self._tokens)
        self._held[token] = (stream, first, list(placements))
        try:
            yield
        finally:
            del self._held[token]

    def __len__(self) -> int:
        return len(self._held)
