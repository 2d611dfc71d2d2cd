"""SESSION_FETCH, leader side, over real sockets: three real partitions of one leader, one follower connection.

What one request must do for each partition what a REPLICA_FETCH does (acknowledge, fence, refuse), share one
byte budget fairly, and long-poll once for all of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from tests.helpers import BOUND
from tidelog.broker.partitions.partition import Partition
from tidelog.protocol.connection import Connection
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import Acks
from tidelog.protocol.peer_messages import EpochEndOffsetRequest
from tidelog.protocol.session_messages import (
    SessionFetchEntry,
    SessionFetchPartition,
    SessionFetchRequest,
    SessionFetchResponse,
    split_payload,
)
from tidelog.testing.replica_leader import Leader, batch, open_log, start_leader

EPOCH = 3


@pytest.fixture
async def leader(tmp_path: Path) -> AsyncIterator[Leader]:
    """Broker ``a`` leading ``s/0``, ``s/1`` and ``s/2`` (replicas a, b) at epoch 3."""
    started = await start_leader(open_log(tmp_path / "p0"), epoch=EPOCH)
    for i in (1, 2):
        started.lead_also(open_log(tmp_path / f"p{i}"))
    try:
        yield started
    finally:
        await started.close()


@pytest.fixture
async def conn(leader: Leader) -> AsyncIterator[Connection]:
    connection = await Connection.open("127.0.0.1", leader.port)
    try:
        yield connection
    finally:
        await connection.close()


def partition(leader: Leader, i: int) -> Partition:
    return leader.others[i - 1] if i else leader.partition


async def session_fetch(
    conn: Connection, entries: list[SessionFetchEntry], *, max_bytes: int = 1 << 20, wait_ms: int = 0
) -> dict[tuple[str, int], tuple[SessionFetchPartition, bytes]]:
    request = SessionFetchRequest("b", tuple(entries), max_bytes, 1 << 20, wait_ms)
    response = await conn.request(request, timeout=BOUND)
    assert isinstance(response.header, SessionFetchResponse)
    return {(p.stream, p.partition): (p, bytes(d)) for p, d in split_payload(response.header, response.payload)}


def at(i: int, offset: int = 0, *, known_hw: int = 0, epoch: int = EPOCH, stream: str = "s") -> SessionFetchEntry:
    return SessionFetchEntry(stream, i, offset, epoch, known_hw)


async def test_every_partition_with_data_is_served_and_the_idle_ones_are_left_out(
    leader: Leader, conn: Connection
) -> None:
    await partition(leader, 0).append(batch(b"x", b"y"), Acks.LEADER, BOUND)
    await partition(leader, 2).append(batch(b"z"), Acks.LEADER, BOUND)
    answer = await session_fetch(conn, [at(0), at(1), at(2)])
    assert set(answer) == {("s", 0), ("s", 2)}
    assert answer[("s", 0)][1] == partition(leader, 0).log.read(0, 1 << 20)
    assert answer[("s", 2)][1] == partition(leader, 2).log.read(0, 1 << 20)
    assert answer[("s", 0)][0].log_end == 2 and answer[("s", 2)][0].log_end == 1
    # Each entry is the follower's acknowledgement: asking at the log ends commits both partitions' batches.
    answer = await session_fetch(conn, [at(0, 2), at(1), at(2, 1)])
    assert {k: (p.high_watermark, d) for k, (p, d) in answer.items()} == {("s", 0): (2, b""), ("s", 2): (1, b"")}
    assert partition(leader, 0).high_watermark == 2 and partition(leader, 2).high_watermark == 1
    assert partition(leader, 1).high_watermark == 0


async def test_a_refused_partition_is_answered_alone_and_the_others_are_served(
    leader: Leader, conn: Connection
) -> None:
    await partition(leader, 1).append(batch(b"v"), Acks.LEADER, BOUND)
    entries = [at(0, epoch=EPOCH - 1), at(1), at(0, stream="absent"), at(2, 5)]
    answer = await session_fetch(conn, entries)
    codes = {k: p.error.code for k, (p, _) in answer.items() if p.error is not None}
    assert codes == {
        ("s", 0): ErrorCode.FENCED_LEADER_EPOCH,
        ("absent", 0): ErrorCode.UNKNOWN_STREAM,
        ("s", 2): ErrorCode.PARTITION_SUSPENDED,  # beyond the log end: evidence, as for REPLICA_FETCH
    }
    assert answer[("s", 1)][1] == partition(leader, 1).log.read(0, 1 << 20)
    assert partition(leader, 0).followers.state("b").log_end == -1  # type: ignore[union-attr]  # nothing acked


async def test_the_budget_is_shared_in_request_order_and_the_first_batch_comes_whole(
    leader: Leader, conn: Connection
) -> None:
    big = batch(b"x" * 3000)
    for i in (0, 1):
        await partition(leader, i).append(big, Acks.LEADER, BOUND)
    # A budget smaller than one batch: the first partition's batch still comes (else it could never be copied);
    # the second's does not fit what is left, and waits for a round where it comes first.
    answer = await session_fetch(conn, [at(0), at(1)], max_bytes=1000)
    assert len(answer[("s", 0)][1]) > 1000 and answer[("s", 1)] == (answer[("s", 1)][0], b"")
    assert answer[("s", 1)][0].log_end == 1  # its bounds still come: the follower knows it is behind
    answer = await session_fetch(conn, [at(1), at(0)], max_bytes=1000)  # the follower rotated the order
    assert len(answer[("s", 1)][1]) > 1000 and answer[("s", 0)][1] == b""


async def test_one_long_poll_waits_for_a_write_to_any_partition(leader: Leader, conn: Connection) -> None:
    for i in range(3):
        await partition(leader, i).append(batch(b"old"), Acks.LEADER, BOUND)
    await session_fetch(conn, [at(i, 1) for i in range(3)])  # acknowledges all three: HW 1 everywhere
    entries = [at(i, 1, known_hw=1) for i in range(3)]
    polling = asyncio.create_task(session_fetch(conn, entries, wait_ms=int(BOUND * 1000)))
    # Another connection's request answered after the poll was sent: the poll has been read and is parked.
    other = await Connection.open("127.0.0.1", leader.port)
    try:
        await other.request(EpochEndOffsetRequest("s", 0, "b", EPOCH), timeout=BOUND)
    finally:
        await other.close()
    assert not polling.done()
    await partition(leader, 1).append(batch(b"new"), Acks.LEADER, BOUND)
    answer = await asyncio.wait_for(polling, BOUND)
    assert list(answer) == [("s", 1)] and answer[("s", 1)][1] == partition(leader, 1).log.read(1, 1 << 20)
    for i in range(3):
        assert not partition(leader, i)._tail_waiters  # the one waiter left every partition it waited on


async def test_a_replica_being_added_under_a_throttle_is_paced_and_the_others_are_not(
    leader: Leader, conn: Connection
) -> None:
    moving = partition(leader, 0)  # b is being added to s/0 at 1,000 bytes/s; s/2 is not being reassigned
    moving.update_record(
        msgspec.structs.replace(moving.record, reassign_from=("a",), reassign_to=("a", "b"), throttle_bps=1000)
    )
    for i in (0, 2):
        await partition(leader, i).append(batch(b"x" * 600), Acks.LEADER, BOUND)
    first = await session_fetch(conn, [at(0), at(2)])
    assert first[("s", 0)][1] and first[("s", 2)][1]  # nothing sent before: both served; s/0 now owes ~0.6 s
    for i in (0, 2):
        await partition(leader, i).append(batch(b"y" * 600), Acks.LEADER, BOUND)
    second = await session_fetch(conn, [at(0, 1), at(2, 1)])
    assert second[("s", 0)][1] == b"" and second[("s", 0)][0].log_end == 2  # held back, its bounds still sent
    assert second[("s", 2)][1] == partition(leader, 2).log.read(1, 1 << 20)
    # Alone, the held-back partition is not answered empty at once (the follower would spin): the answer waits
    # until it is due and then carries its batch.
    third = await session_fetch(conn, [at(0, 1), at(2, 2, known_hw=2)], wait_ms=int(BOUND * 1000))
    assert third[("s", 0)][1] == moving.log.read(1, 1 << 20)
