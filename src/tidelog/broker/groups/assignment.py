"""Assigning a group's partitions to its members: balanced, and moving as few partitions as it can.

Every partition of every stream at least one member consumes is assigned to exactly one member that consumes
that stream. The assignment is computed by the controller on each membership change from the previous one, in
three steps:

1. **keep**: each partition stays with its previous owner while that owner is still a member and still consumes
   the stream;
2. **place**: each partition without an owner (new stream, new partitions, owner gone) goes to the eligible member
   with the fewest partitions (ties: the smaller member id);
3. **even out**: while some member holds a partition that a member with at least two fewer partitions could take,
   the partition moves there (the most loaded member gives first). Each move lowers the sum of squared loads,
   so this ends; it is also bounded by the number of partitions.

When every member consumes the same streams the loads then differ by at most one, as with Liftbridge's
assignor; unlike it, a member joining takes partitions only from the members above the new average, and a member
leaving only has its own partitions placed elsewhere, so consumers that keep their partitions keep consuming
undisturbed. Everything is ordered (streams, partitions, member ids), so the same inputs give the same
assignment on any broker.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterable, Mapping

Assignment = dict[str, dict[str, list[int]]]
"""member id → stream → sorted partition ids (a member with none maps to an empty dict)."""


def assign(
    subscriptions: Mapping[str, Iterable[str]],
    partition_counts: Mapping[str, int],
    previous: Mapping[str, Mapping[str, Iterable[int]]] | None = None,
) -> Assignment:
    """The assignment of the module docstring.

    ``subscriptions`` maps each member to the streams it consumes; ``partition_counts`` each stream to its number
    of partitions (a stream missing there has none, e.g. it was deleted); ``previous`` is the last assignment.
    """
    members = sorted(subscriptions)
    consumes = {m: set(subscriptions[m]) for m in members}
    owner: dict[tuple[str, int], str] = {}
    load = dict.fromkeys(members, 0)
    wanted = sorted({s for m in members for s in consumes[m]})
    all_partitions = [(s, p) for s in wanted for p in range(max(0, partition_counts.get(s, 0)))]
    valid = set(all_partitions)

    for m, streams in sorted((previous or {}).items()):  # 1. keep
        if m not in consumes:
            continue
        for stream, ids in sorted(streams.items()):
            if stream not in consumes[m]:
                continue
            for p in sorted(ids):
                key = (stream, p)
                if key in valid and key not in owner:
                    owner[key] = m
                    load[m] += 1

    eligible = {s: [m for m in members if s in consumes[m]] for s in wanted}
    for key in all_partitions:  # 2. place
        if key not in owner:
            taker = min(eligible[key[0]], key=lambda m: (load[m], m))
            owner[key] = taker
            load[taker] += 1

    held: dict[str, list[tuple[str, int]]] = {m: [] for m in members}
    for key, m in sorted(owner.items()):
        held[m].append(key)
    for _ in range(len(all_partitions) * max(1, len(members))):  # 3. even out (bounded; see the docstring)
        move = _next_move(held, load, eligible)
        if move is None:
            break
        key, giver, taker = move
        held[giver].remove(key)
        insort(held[taker], key)
        load[giver] -= 1
        load[taker] += 1
        owner[key] = taker

    result: Assignment = {m: {} for m in members}
    for (stream, p), m in sorted(owner.items()):
        result[m].setdefault(stream, []).append(p)
    return result


def _next_move(
    held: Mapping[str, list[tuple[str, int]]], load: Mapping[str, int], eligible: Mapping[str, list[str]]
) -> tuple[tuple[str, int], str, str] | None:
    """``(partition, giver, taker)``: the first partition of the most loaded member (that has one to give) that a
    member holding at least two fewer consumes, to the least loaded such member; None when there is none."""
    for giver in sorted(load, key=lambda m: (-load[m], m)):
        for key in held[giver]:
            takers = [m for m in eligible[key[0]] if load[m] <= load[giver] - 2]
            if takers:
                return key, giver, min(takers, key=lambda m: (load[m], m))
    return None


def as_tuples(assignment: Mapping[str, list[int]]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """One member's assignment in the form of :attr:`~tidelog.metadata.group_records.GroupMember.assignments`."""
    return tuple((stream, tuple(ids)) for stream, ids in sorted(assignment.items()) if ids)
