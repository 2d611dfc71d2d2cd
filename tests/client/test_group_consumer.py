"""The group consumer against a real broker: members share a stream's partitions, a member that leaves hands its
partitions over at its committed offsets, and committed offsets, positions, seeks, resets and rebalance callbacks
behave as documented (:mod:`tidelog.client.group_consumer`)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from tests.broker.helpers import until
from tests.client.group_helpers import CursorWatch, Reader, produce
from tests.helpers import BOUND
from tidelog.client import (
    Admin,
    GroupConsumer,
    StreamPartition,
    TidelogClient,
)
from tidelog.protocol.connection import Connection
from tidelog.protocol.errors import StaleGroupEpochError, UnknownGroupError
from tidelog.protocol.group_messages import (
    DescribeGroupRequest,
    DescribeGroupResponse,
    JoinGroupRequest,
    LeaveGroupRequest,
)

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

HEARTBEAT_MS = 200
"""Members heartbeat often here, so a rebalance reaches them soon (the broker's consumer timeout stays 15 s)."""


def member(address: str, stream: str, group: str, consumer_id: str, **options: Any) -> GroupConsumer:
    options.setdefault("auto_offset_reset", "earliest")
    options.setdefault("heartbeat_interval_ms", HEARTBEAT_MS)
    return GroupConsumer(address, stream, group_id=group, consumer_id=consumer_id, **options)


async def test_two_members_share_four_partitions_and_hand_over_at_the_committed_offset(
    address: str, stream_name: str
) -> None:
    group = f"g-{stream_name}"
    async with Admin(address) as admin:
        await admin.create_stream(stream_name, partitions=4)
        await produce(address, stream_name, range(4), 20)
        watch = CursorWatch(admin, stream_name, group, 4)
        assigned_to_b: list[frozenset[StreamPartition]] = []
        a = Reader(member(address, stream_name, group, "a", auto_commit_interval_ms=50))
        b = Reader(
            member(address, stream_name, group, "b", auto_commit_interval_ms=50, on_assigned=assigned_to_b.append)
        )
        try:
            await a.start()
            assert {tp.partition for tp in a.consumer.assignment()} == {0, 1, 2, 3}
            await b.start()

            def shared() -> bool:
                mine, theirs = a.consumer.assignment(), b.consumer.assignment()
                return len(mine) == 2 and len(theirs) == 2 and not mine & theirs

            await until(shared, "the two members to hold two partitions each")
            await produce(address, stream_name, range(4), 20, first=20)
            await until(lambda: len(a.seen) + len(b.seen) >= 80, "both members to read the first 80 records")
            held_by_a = {tp.partition for tp in a.consumer.assignment()}
            await a.stop()  # commits its positions, then leaves: its partitions go to b
            committed = {p: await admin.fetch_cursor(stream_name, p, group) for p in range(4)}
            for p in held_by_a:
                assert committed[p] == max(a.offsets(p)) + 1  # a's last record handed out, plus one
            await until(lambda: len(b.consumer.assignment()) == 4, "b to take a's partitions")
            await produce(address, stream_name, range(4), 10, first=40)

            def every_record_seen() -> bool:
                return all(set(range(50)) <= set(a.offsets(p)) | set(b.offsets(p)) for p in range(4))

            await until(every_record_seen, "every record to be consumed by one member or the other")
            for p in held_by_a:
                assert min(b.offsets(p)) == committed[p]  # b resumed exactly after a's last committed record
                assert b.offsets(p) == sorted(set(b.offsets(p)))
            assert frozenset(StreamPartition(stream_name, p) for p in held_by_a) in assigned_to_b
            await b.stop()
        finally:
            for reader in (a, b):
                with contextlib.suppress(Exception):
                    await reader.consumer.close()
            await watch.stop()
        assert watch.regressions == []
        final = {p: await admin.fetch_cursor(stream_name, p, group) for p in range(4)}
        assert final == dict.fromkeys(range(4), 50)


async def test_auto_offset_reset_applies_only_without_a_committed_offset(address: str, stream_name: str) -> None:
    tp = StreamPartition(stream_name, 0)
    async with Admin(address) as admin:
        await admin.create_stream(stream_name)
    await produce(address, stream_name, [0], 5)
    async with member(address, stream_name, f"e-{stream_name}", "m", auto_offset_reset="earliest") as earliest:
        assert earliest.position(tp) == 0
        first = await earliest.getone(timeout=BOUND)
        assert first is not None and first.offset == 0
    group = f"l-{stream_name}"
    async with member(address, stream_name, group, "m", auto_offset_reset="latest") as latest:
        assert latest.position(tp) == 5
        await produce(address, stream_name, [0], 1, first=5)
        record = await latest.getone(timeout=BOUND)
        assert record is not None and record.offset == 5 and record.value == b"0:5"
    async with member(address, stream_name, group, "m2", auto_offset_reset="earliest") as resumed:
        assert resumed.position(tp) == 6  # the committed offset, not the reset
        assert await resumed.committed(tp) == 6


async def test_seek_position_commit_and_committed(address: str, stream_name: str) -> None:
    tp, other = StreamPartition(stream_name, 0), StreamPartition(stream_name, 1)
    async with Admin(address) as admin:
        await admin.create_stream(stream_name)
    await produce(address, stream_name, [0], 6)
    group = f"s-{stream_name}"
    async with member(address, stream_name, group, "m", enable_auto_commit=False) as consumer:
        assert consumer.assignment() == {tp}
        assert await consumer.committed(tp) is None
        record = await consumer.getone(timeout=BOUND)
        assert record is not None and record.offset == 0 and consumer.position(tp) == 1
        await consumer.commit()
        assert await consumer.committed(tp) == 1
        await consumer.commit({tp: 4})
        assert await consumer.committed(tp) == 4
        consumer.seek(tp, 2)
        assert consumer.position(tp) == 2
        record = await consumer.getone(timeout=BOUND)
        assert record is not None and record.offset == 2 and consumer.position(tp) == 3
        with pytest.raises(ValueError, match="not assigned"):
            consumer.seek(other, 0)
        with pytest.raises(ValueError, match=">= 0"):
            consumer.seek(tp, -1)
        with pytest.raises(ValueError, match=">= 0"):
            await consumer.commit({tp: -1})
        with pytest.raises(StaleGroupEpochError, match="does not own"):
            await consumer.commit({other: 1})
    async with Admin(address) as admin:
        assert await admin.fetch_cursor(stream_name, 0, group) == 4  # no auto-commit: close committed nothing


async def test_rebalance_callbacks(address: str, stream_name: str) -> None:
    events: list[tuple[str, str, frozenset[int]]] = []

    def note(who: str, what: str) -> Any:
        def called(partitions: frozenset[StreamPartition]) -> None:
            events.append((who, what, frozenset(tp.partition for tp in partitions)))

        return called

    async def b_assigned(partitions: frozenset[StreamPartition]) -> None:  # a coroutine callback is awaited
        note("b", "assigned")(partitions)

    async with Admin(address) as admin:
        await admin.create_stream(stream_name, partitions=2)
    group = f"r-{stream_name}"
    a = Reader(
        member(address, stream_name, group, "a", on_assigned=note("a", "assigned"), on_revoked=note("a", "revoked"))
    )
    b = Reader(member(address, stream_name, group, "b", on_assigned=b_assigned, on_revoked=note("b", "revoked")))
    try:
        await a.start()
        assert events == [("a", "assigned", frozenset({0, 1}))]
        await b.start()
        await until(lambda: any(e[:2] == ("a", "revoked") for e in events), "a to give up a partition")
        moved = next(e[2] for e in events if e[:2] == ("a", "revoked"))
        assert len(moved) == 1 and ("b", "assigned", moved) in events
        await b.stop()
        assert ("b", "revoked", moved) in events
        await until(lambda: events[-1] == ("a", "assigned", moved), "a to take the partition back")
        await a.stop()
        assert events[-1] == ("a", "revoked", frozenset({0, 1}))
    finally:
        for reader in (a, b):
            with contextlib.suppress(Exception):
                await reader.consumer.close()


async def test_a_member_removed_from_the_group_cannot_commit(address: str, stream_name: str) -> None:
    tp = StreamPartition(stream_name, 0)
    async with Admin(address) as admin:
        await admin.create_stream(stream_name)
    await produce(address, stream_name, [0], 3)
    group = f"f-{stream_name}"
    # heartbeating rarely, so that it learns of its removal only when it tries to commit (a paused process)
    stale = member(address, stream_name, group, "stale", enable_auto_commit=False, heartbeat_interval_ms=10_000)
    await stale.start()
    try:
        record = await stale.getone(timeout=BOUND)
        assert record is not None and record.offset == 0
        host, _, port = address.rpartition(":")
        connection = await Connection.open(host, int(port))
        try:  # what the coordinator does to a member that went quiet: remove it
            await connection.request(LeaveGroupRequest(group, "stale"), timeout=BOUND)
        finally:
            await connection.close()
        async with member(address, stream_name, group, "new", enable_auto_commit=False) as new:
            await until(lambda: new.assignment() == {tp}, "the new member to hold the partition")
            await new.commit({tp: 2})
            with pytest.raises(StaleGroupEpochError, match="does not own"):
                await stale.commit()
            async with Admin(address) as admin:
                assert await admin.fetch_cursor(stream_name, 0, group) == 2  # the new owner's, not set back
    finally:
        await stale.close()


def sync_member(address: str, stream: str) -> None:
    tp = StreamPartition(stream, 0)
    with TidelogClient(address) as client:
        client.admin.create_stream(stream)
        with client.producer() as producer:
            producer.send_many(stream, [b"a", b"b", b"c"], timeout=BOUND)
        options: dict[str, Any] = {"auto_offset_reset": "earliest", "enable_auto_commit": False}
        with client.group_consumer(stream, group_id=f"y-{stream}", **options) as consumer:
            assert consumer.assignment() == {tp}
            first = consumer.poll(BOUND)
            assert first is not None and first.value == b"a" and consumer.position(tp) == 1
            consumer.commit()
            assert consumer.committed(tp) == 1
            consumer.seek(tp, 2)
            last = next(iter(consumer))
            assert last.value == b"c"
        with client.group_consumer(stream, group_id=f"y-{stream}", **options) as again:
            resumed = again.poll(BOUND)
            assert resumed is not None and resumed.value == b"b"  # after the committed offset


async def test_the_sync_facade(address: str, stream_name: str) -> None:
    await asyncio.to_thread(sync_member, address, stream_name)


async def test_bad_options_are_refused_before_joining(address: str) -> None:
    with pytest.raises(ValueError, match="one or more streams"):
        GroupConsumer(address, [], group_id="g")
    with pytest.raises(ValueError, match="'earliest' or 'latest'"):
        GroupConsumer(address, "s", group_id="g", auto_offset_reset="error")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="auto_commit_interval_ms"):
        GroupConsumer(address, "s", group_id="g", auto_commit_interval_ms=0)


async def test_a_heartbeat_interval_not_below_the_consumer_timeout_is_refused(address: str, stream_name: str) -> None:
    async with Admin(address) as admin:
        await admin.create_stream(stream_name)
    consumer = GroupConsumer(address, stream_name, group_id=f"h-{stream_name}", heartbeat_interval_ms=10**6)
    try:
        with pytest.raises(ValueError, match="below the brokers' group consumer timeout"):
            await consumer.start()
    finally:
        await consumer.close()


async def test_a_restart_with_the_id_of_a_member_not_yet_timed_out_takes_its_place(
    address: str, stream_name: str
) -> None:
    async with Admin(address) as admin:
        await admin.create_stream(stream_name, partitions=2)
    group = f"i-{stream_name}"
    host, _, port = address.rpartition(":")
    connection = await Connection.open(host, int(port))
    try:  # an earlier run of consumer "x" joined, then crashed: it is a member until its timeout
        await connection.request(JoinGroupRequest(group, "x", (stream_name,)), timeout=BOUND)

        async def listed() -> bool:  # the broker's mirror shows the controller's write a moment later
            try:
                await connection.request(DescribeGroupRequest(group), timeout=BOUND)
            except UnknownGroupError:
                return False
            return True

        await until(listed, "the earlier member in the group's record")
        async with member(address, stream_name, group, "x") as restarted:
            assert {tp.partition for tp in restarted.assignment()} == {0, 1}
            described = (await connection.request(DescribeGroupRequest(group), timeout=BOUND)).header
            assert isinstance(described, DescribeGroupResponse)
            assert [m.consumer_id for m in described.members] == ["x"]
    finally:
        await connection.close()
