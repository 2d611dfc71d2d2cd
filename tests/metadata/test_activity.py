"""Committed etcd changes become Liftbridge activity events: one per change, ids from the revision."""

from __future__ import annotations

import msgspec

from tidelog.metadata.activity import ID_SCALE, Change, describe, events_of, revision_of
from tidelog.metadata.group_records import GroupMember, GroupRecord, encode_group, group_key
from tidelog.metadata.records import Keys, PartitionRecord, StreamRecord, encode

KEYS = Keys("/ns")
STREAM = StreamRecord("orders", "orders", "", 3, 1, 0)


def part(pid: int, **fields: object) -> PartitionRecord:
    return msgspec.structs.replace(PartitionRecord("orders", pid, ("b1",), "b1", ("b1",)), **fields)


def put(key: bytes, new: bytes, old: bytes | None = None, revision: int = 7) -> Change:
    return Change(revision, key, new, old)


def test_stream_creation_and_deletion() -> None:
    (created,) = events_of(
        KEYS, 7, [put(KEYS.partition("orders", 0), encode(part(0))), put(KEYS.stream("orders"), encode(STREAM))]
    )
    assert describe(created) == ("CREATE_STREAM", "orders", "partitions 0,1,2")
    assert created.id == 7 * ID_SCALE and revision_of(created.id) == 7
    deletes = [
        Change(9, KEYS.stream("orders"), None, encode(STREAM)),
        Change(9, KEYS.partition("orders", 0), None, b"x"),
    ]
    (deleted,) = events_of(KEYS, 9, deletes)
    assert describe(deleted) == ("DELETE_STREAM", "orders", "")


def test_partition_flags_of_one_transaction_make_one_event_per_kind() -> None:
    changes = [
        put(KEYS.partition("orders", pid), encode(part(pid, paused=True, resume_all=True)), encode(part(pid)))
        for pid in (0, 2)
    ]
    changes.append(put(KEYS.partition("orders", 1), encode(part(1, readonly=True)), encode(part(1))))
    events = events_of(KEYS, 11, changes)
    assert [describe(e) for e in events] == [
        ("PAUSE_STREAM", "orders", "partitions 0,2, resume all"),
        ("SET_STREAM_READONLY", "orders", "partitions 1, readonly true"),
    ]
    assert [e.id for e in events] == [11 * ID_SCALE, 11 * ID_SCALE + 1]
    (resumed,) = events_of(KEYS, 12, [put(KEYS.partition("orders", 0), encode(part(0)), encode(part(0, paused=True)))])
    assert describe(resumed) == ("RESUME_STREAM", "orders", "partitions 0")


def test_leader_and_isr_changes_say_nothing() -> None:
    moved = put(KEYS.partition("orders", 0), encode(part(0, leader="b2", leader_epoch=1)), encode(part(0)))
    assert events_of(KEYS, 5, [moved, put(KEYS.broker("b9"), b"\x90")]) == []


def test_group_joins_and_leaves() -> None:
    key = group_key(KEYS, "g")
    one = GroupRecord("g", "b1", 1, (GroupMember("c1", ("orders",)),))
    two = GroupRecord("g", "b1", 2, (GroupMember("c1", ("orders",)), GroupMember("c2", ("orders", "refunds"))))
    (joined,) = events_of(KEYS, 3, [put(key, encode_group(two), encode_group(one))])
    assert describe(joined) == ("JOIN_CONSUMER_GROUP", "g", "consumer c2, streams orders,refunds")
    gone = events_of(KEYS, 4, [Change(4, key, None, encode_group(two))])
    assert [describe(e) for e in gone] == [
        ("LEAVE_CONSUMER_GROUP", "g", "consumer c1"),
        ("LEAVE_CONSUMER_GROUP", "g", "consumer c2"),
    ]
