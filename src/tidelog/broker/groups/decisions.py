"""What each group change makes of a group's record: pure functions, so every rule is tested without etcd.

The controller (:mod:`tidelog.broker.groups.membership`) reads the record from etcd, asks one of these for the
new record, and writes it with a fenced compare-and-swap. Each function either returns the record to write (None:
delete the group) or raises the error the requester gets, Liftbridge's answer in each case:

- :func:`decide_join`: a new group gets the live broker coordinating the fewest groups; a consumer already a
  member, or a stream that does not exist, is refused (GROUP_REFUSED, FailedPrecondition) and nothing is stored;
- :func:`decide_leave`: an unknown group is UNKNOWN_GROUP (NotFound), a consumer not a member UNKNOWN_MEMBER
  (FailedPrecondition); the last member leaving deletes the group;
- :func:`decide_new_coordinator`: another live broker, the one coordinating the fewest groups;
- :func:`decide_reconcile`: what the controller fixes by itself, without a request: a coordinator whose broker
  is gone, members consuming a stream that was deleted, and assignments that no longer cover the streams'
  partitions.

Every returned record carries ``epoch`` (see :mod:`tidelog.metadata.group_records` for where it comes from) and
an assignment computed from the previous one (:func:`~tidelog.broker.groups.assignment.assign`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from tidelog.broker.groups.assignment import as_tuples, assign
from tidelog.metadata.group_records import GroupMember, GroupRecord, count_coordinated
from tidelog.protocol.errors import GroupRefusedError, UnavailableError, UnknownGroupError, UnknownMemberError


def pick_coordinator(
    candidates: Collection[str], groups: Mapping[str, GroupRecord], exclude: str | None = None
) -> str | None:
    """The candidate (a live broker id) coordinating the fewest groups, ties to the smaller id; None if none."""
    counts = count_coordinated(groups)
    eligible = sorted(b for b in candidates if b != exclude)
    if not eligible:
        return None
    return min(eligible, key=lambda b: (counts.get(b, 0), b))


def rebalanced(
    record: GroupRecord, members: Sequence[GroupMember], partition_counts: Mapping[str, int], epoch: int
) -> GroupRecord:
    """``record`` with ``members`` (their streams as given), assignments recomputed from the current ones."""
    previous = {m.id: {s: list(ids) for s, ids in m.assignments} for m in record.members}
    plan = assign({m.id: m.streams for m in members}, partition_counts, previous)
    new_members = tuple(
        GroupMember(m.id, m.streams, as_tuples(plan.get(m.id, {}))) for m in sorted(members, key=lambda m: m.id)
    )
    return GroupRecord(record.id, record.coordinator, epoch, new_members, record.created_ns)


def decide_join(
    record: GroupRecord | None,
    group_id: str,
    consumer_id: str,
    streams: Sequence[str],
    partition_counts: Mapping[str, int],
    live_brokers: Collection[str],
    groups: Mapping[str, GroupRecord],
    epoch: int,
    now_ns: int,
) -> GroupRecord:
    """The record after ``consumer_id`` joins ``group_id`` consuming ``streams``."""
    missing = sorted({s for s in streams if s not in partition_counts})
    if missing:
        raise GroupRefusedError(
            f"cannot join consumer group {group_id}: no such stream{'s' if len(missing) > 1 else ''} "
            + ", ".join(missing)
        )
    wanted = tuple(sorted(set(streams)))
    if record is None:
        coordinator = pick_coordinator(live_brokers, groups)
        if coordinator is None:
            raise UnavailableError(f"no live broker can coordinate consumer group {group_id}")
        record = GroupRecord(group_id, coordinator, epoch, (), now_ns)
    elif record.member(consumer_id) is not None:
        raise GroupRefusedError(f"consumer {consumer_id} is already a member of consumer group {group_id}")
    return rebalanced(record, [*record.members, GroupMember(consumer_id, wanted)], partition_counts, epoch)


def decide_leave(
    record: GroupRecord | None, group_id: str, consumer_id: str, partition_counts: Mapping[str, int], epoch: int
) -> GroupRecord | None:
    """The record after ``consumer_id`` leaves (None: it was the last member, the group goes)."""
    if record is None:
        raise UnknownGroupError(f"no such consumer group {group_id}")
    if record.member(consumer_id) is None:
        raise UnknownMemberError(f"consumer {consumer_id} is not a member of consumer group {group_id}")
    rest = [m for m in record.members if m.id != consumer_id]
    if not rest:
        return None
    return rebalanced(record, rest, partition_counts, epoch)


def decide_new_coordinator(
    record: GroupRecord, live_brokers: Collection[str], groups: Mapping[str, GroupRecord], epoch: int
) -> GroupRecord:
    """The record with another coordinator than the current one (reported failed by a majority of members)."""
    coordinator = pick_coordinator(live_brokers, groups, exclude=record.coordinator)
    if coordinator is None:
        raise GroupRefusedError(f"no group coordinator candidates for consumer group {record.id}")
    return GroupRecord(record.id, coordinator, epoch, record.members, record.created_ns)


def decide_reconcile(
    record: GroupRecord,
    partition_counts: Mapping[str, int],
    live_brokers: Collection[str],
    groups: Mapping[str, GroupRecord],
    epoch: int,
) -> GroupRecord | None:
    """The record the controller should write by itself for ``record``, or None when it is fine as it is."""
    coordinator = record.coordinator
    if coordinator not in live_brokers:
        coordinator = pick_coordinator(live_brokers, groups, exclude=coordinator) or coordinator
    members = [
        GroupMember(m.id, tuple(s for s in m.streams if s in partition_counts), m.assignments) for m in record.members
    ]
    fixed = rebalanced(record, members, partition_counts, record.epoch)
    fixed = GroupRecord(fixed.id, coordinator, record.epoch, fixed.members, fixed.created_ns)
    if fixed == record:
        return None
    return GroupRecord(fixed.id, fixed.coordinator, epoch, fixed.members, fixed.created_ns)
