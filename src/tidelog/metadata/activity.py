"""The events of the activity stream ``__activity``, derived from committed etcd changes.

Every metadata change the controller commits is one etcd transaction, at one revision. The activity feed
(:mod:`~tidelog.metadata.activity_feed`) reads those changes back from etcd's history, each key with its previous
value, and :func:`events_of` turns the changes of one revision into Liftbridge's ``ActivityStreamEvent`` s:

=====================================  ===============================================================
etcd change                            event
=====================================  ===============================================================
stream record put, none before         ``CREATE_STREAM`` (every partition of the stream)
stream record deleted                  ``DELETE_STREAM`` (its partitions' deletes say nothing more)
partition record, ``paused`` set       ``PAUSE_STREAM`` (``resumeAll`` as recorded)
partition record, ``paused`` cleared   ``RESUME_STREAM``
partition record, ``readonly`` flips   ``SET_STREAM_READONLY`` (``readonly`` the new value)
group record gains a member            ``JOIN_CONSUMER_GROUP`` (the member's streams)
group record loses a member, or goes   ``LEAVE_CONSUMER_GROUP``
=====================================  ===============================================================

Partitions of one stream changed in one transaction make one event listing them. Leader and ISR changes, broker
registrations and the controller's own keys make none (Liftbridge publishes none for them either).

**Ids.** An event's id is ``revision * ID_SCALE + n``: the etcd revision of the change, and the event's place
among that revision's events (almost always 0). Revisions only grow, so ids never repeat and follow commit order;
the same change always gives the same id, so a consumer that sees an id twice (the feed publishes at least once)
drops the copy. ``revision_of(id)`` gives the revision back.

``LeaveConsumerGroupOp.expired`` is always false: the group record does not say whether a member left or timed
out (the coordinator's log does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from tidelog.metadata.group_records import GroupRecord, decode_group, group_prefix
from tidelog.metadata.records import Keys, PartitionRecord, decode_partition, decode_stream
from tidelog.protocol._gen import api_pb2 as pb

ACTIVITY_STREAM: Final = "__activity"
ID_SCALE: Final = 1_000_000
"""Events one revision may hold; ids stay below 2**64 up to revision 18e12."""

Op = pb.ActivityStreamOp


@dataclass(frozen=True, slots=True)
class Change:
    """One key of one committed etcd revision: its value after (None: deleted) and before (None: the key was
    created; empty: etcd no longer holds it)."""

    revision: int
    key: bytes
    value: bytes | None
    previous: bytes | None


def event_id(revision: int, index: int) -> int:
    return revision * ID_SCALE + index


def revision_of(event_id: int) -> int:
    """The etcd revision whose change the event ``event_id`` reports."""
    return event_id // ID_SCALE


def events_of(keys: Keys, revision: int, changes: Sequence[Change]) -> list[pb.ActivityStreamEvent]:
    """The events of one revision's ``changes``, in key order (etcd's order within a transaction)."""
    groups = group_prefix(keys)
    streams, partitions, members = keys.streams.encode(), keys.partitions.encode(), []
    found: list[pb.ActivityStreamEvent] = []
    flips: dict[tuple[int, str, bool], list[int]] = {}  # (op, stream, flag) -> partitions, in order of the keys
    for change in changes:
        if change.key.startswith(streams):
            event = _stream_event(change, change.key[len(streams) :].decode())
            if event is not None:
                found.append(event)
        elif change.key.startswith(partitions) and change.value is not None and change.previous:
            _partition_flips(decode_partition(change.previous), decode_partition(change.value), flips)
        elif change.key.startswith(groups):
            members.extend(_group_events(change))
    for (op, stream, flag), ids in flips.items():
        found.append(_partition_event(op, stream, sorted(ids), flag))
    found.extend(members)
    for index, event in enumerate(found):
        event.id = event_id(revision, index)
    return found


def _stream_event(change: Change, name: str) -> pb.ActivityStreamEvent | None:
    if change.value is None:
        return pb.ActivityStreamEvent(op=Op.DELETE_STREAM, deleteStreamOp=pb.DeleteStreamOp(stream=name))
    if change.previous is not None:
        return None  # rewritten in place: not a creation
    record = decode_stream(change.value)
    return pb.ActivityStreamEvent(
        op=Op.CREATE_STREAM,
        createStreamOp=pb.CreateStreamOp(stream=record.name, partitions=list(range(record.partitions))),
    )


def _partition_flips(old: PartitionRecord, new: PartitionRecord, flips: dict[tuple[int, str, bool], list[int]]) -> None:
    if new.paused and not old.paused:
        flips.setdefault((Op.PAUSE_STREAM, new.stream, new.resume_all), []).append(new.id)
    elif old.paused and not new.paused:
        flips.setdefault((Op.RESUME_STREAM, new.stream, False), []).append(new.id)
    if new.readonly != old.readonly:
        flips.setdefault((Op.SET_STREAM_READONLY, new.stream, new.readonly), []).append(new.id)


def _partition_event(op: int, stream: str, ids: list[int], flag: bool) -> pb.ActivityStreamEvent:
    if op == Op.PAUSE_STREAM:
        return pb.ActivityStreamEvent(
            op=Op.PAUSE_STREAM, pauseStreamOp=pb.PauseStreamOp(stream=stream, partitions=ids, resumeAll=flag)
        )
    if op == Op.RESUME_STREAM:
        return pb.ActivityStreamEvent(
            op=Op.RESUME_STREAM, resumeStreamOp=pb.ResumeStreamOp(stream=stream, partitions=ids)
        )
    return pb.ActivityStreamEvent(
        op=Op.SET_STREAM_READONLY,
        setStreamReadonlyOp=pb.SetStreamReadonlyOp(stream=stream, partitions=ids, readonly=flag),
    )


def _group_events(change: Change) -> list[pb.ActivityStreamEvent]:
    old = _group(change.previous)
    new = _group(change.value)
    either = new or old
    group_id = either.id if either is not None else ""
    before = {m.id: m for m in old.members} if old is not None else {}
    after = {m.id: m for m in new.members} if new is not None else {}
    events = [
        pb.ActivityStreamEvent(
            op=Op.LEAVE_CONSUMER_GROUP,
            leaveConsumerGroupOp=pb.LeaveConsumerGroupOp(groupId=group_id, consumerId=consumer),
        )
        for consumer in sorted(before.keys() - after.keys())
    ]
    events.extend(
        pb.ActivityStreamEvent(
            op=Op.JOIN_CONSUMER_GROUP,
            joinConsumerGroupOp=pb.JoinConsumerGroupOp(
                groupId=group_id, consumerId=consumer, streams=list(after[consumer].streams)
            ),
        )
        for consumer in sorted(after.keys() - before.keys())
    )
    return events


def _group(raw: bytes | None) -> GroupRecord | None:
    return decode_group(raw) if raw else None


def describe(event: pb.ActivityStreamEvent) -> tuple[str, str, str]:
    """``(op, subject, detail)`` of an event, for tables and logs: the stream or group, and what changed."""
    op = Op.Name(event.op)
    if event.op == Op.CREATE_STREAM:
        o = event.createStreamOp
        return op, o.stream, f"partitions {_ids(o.partitions)}"
    if event.op == Op.DELETE_STREAM:
        return op, event.deleteStreamOp.stream, ""
    if event.op == Op.PAUSE_STREAM:
        p = event.pauseStreamOp
        return op, p.stream, f"partitions {_ids(p.partitions)}" + (", resume all" if p.resumeAll else "")
    if event.op == Op.RESUME_STREAM:
        return op, event.resumeStreamOp.stream, f"partitions {_ids(event.resumeStreamOp.partitions)}"
    if event.op == Op.SET_STREAM_READONLY:
        r = event.setStreamReadonlyOp
        return op, r.stream, f"partitions {_ids(r.partitions)}, readonly {str(r.readonly).lower()}"
    if event.op == Op.JOIN_CONSUMER_GROUP:
        j = event.joinConsumerGroupOp
        return op, j.groupId, f"consumer {j.consumerId}, streams {','.join(j.streams)}"
    leave = event.leaveConsumerGroupOp
    return op, leave.groupId, f"consumer {leave.consumerId}" + (", expired" if leave.expired else "")


def _ids(ids: Sequence[int]) -> str:
    return ",".join(str(i) for i in ids)
