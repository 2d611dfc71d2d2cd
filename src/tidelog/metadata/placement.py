"""Replica placement: which brokers hold each partition of a new stream, and which one leads.

Replicas go on distinct brokers. Partitions are laid out round-robin from a starting broker chosen to be the one
that is the preferred leader (first replica) of the fewest partitions already, then the one holding the fewest
replicas, so streams created one after another spread their leaders and their load across the cluster instead
of piling onto the alphabetically first broker (with a replication factor equal to the number of brokers every
broker holds every partition, and only the leader count tells them apart).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from tidelog.metadata.records import PartitionRecord
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


def place_replicas(
    brokers: Sequence[str],
    partitions: int,
    replication_factor: int,
    load: Mapping[str, int] | None = None,
    leaders: Mapping[str, int] | None = None,
) -> list[tuple[str, ...]]:
    """Replica lists for ``partitions`` partitions; the first replica of each is its preferred leader.

    ``leaders`` counts the partitions each broker is already the preferred leader of, ``load`` the replicas it
    already holds."""
    if replication_factor > len(brokers):
        raise InvalidArgumentError(f"cannot place {replication_factor} replicas on {len(brokers)} brokers")
    ordered = sorted(brokers)
    load = load or {}
    leaders = leaders or {}
    start = min(range(len(ordered)), key=lambda i: (leaders.get(ordered[i], 0), load.get(ordered[i], 0), i))
    placements: list[tuple[str, ...]] = []
    for p in range(partitions):
        first = (start + p) % len(ordered)
        placements.append(tuple(ordered[(first + r) % len(ordered)] for r in range(replication_factor)))
    return placements


def placement_load(partitions: Iterable[PartitionRecord]) -> tuple[dict[str, int], dict[str, int]]:
    """What :func:`place_replicas` weighs: the replicas each broker holds, and the partitions it is the preferred
    leader (first replica) of."""
    load: dict[str, int] = {}
    leaders: dict[str, int] = {}
    for p in partitions:
        if p.replicas:
            leaders[p.replicas[0]] = leaders.get(p.replicas[0], 0) + 1
        for r in p.replicas:
            load[r] = load.get(r, 0) + 1
    return load, leaders
