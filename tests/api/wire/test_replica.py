"""REPLICA_FETCH and EPOCH_END_OFFSET, leader side, over real sockets: a real ``Partition`` over a real ``Log``.

The harness (:class:`~tidelog.testing.replica_leader.Leader`) is shared with the follower's tests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from tests.helpers import BOUND
from tidelog.api.wire.session import Session
from tidelog.protocol.connection import Connection, ConnectionClosedError
from tidelog.protocol.errors import (
    ErrorCode,
    PartitionSuspendedError,
    UnavailableError,
    UnknownStreamError,
)
from tidelog.protocol.messages import Acks
from tidelog.protocol.peer_messages import (
    EpochEndOffsetRequest,
    EpochEndOffsetResponse,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    SegmentFetchRequest,
    SegmentFetchResponse,
    SegmentListRequest,
    SegmentListResponse,
)
from tidelog.protocol.records import iter_batches
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.log import Log
from tidelog.storage.preallocation import RATE_WINDOW_NS
from tidelog.testing.replica_leader import Leader, batch, open_log, start_leader


@pytest.fixture(params=[True, False], ids=["sendfile", "copy"])
async def leader(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Leader]:
    started = await start_leader(open_log(tmp_path / "leader"), epoch=3, zero_copy=request.param)
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


async def replica_fetch(
    conn: Connection, offset: int, *, epoch: int = 3, replica: str = "b", wait_ms: int = 0
) -> tuple[ReplicaFetchResponse, bytes]:
    response = await conn.request(
        ReplicaFetchRequest("s", 0, replica, offset, epoch, max_wait_ms=wait_ms), timeout=BOUND
    )
    assert isinstance(response.header, ReplicaFetchResponse)
    return response.header, bytes(response.payload)


async def test_returns_batches_up_to_the_log_end_including_uncommitted_ones(leader: Leader, conn: Connection) -> None:
    first, second = batch(b"x", b"y"), batch(b"z")
    await leader.partition.append(first, Acks.LEADER, BOUND)
    await leader.partition.append(second, Acks.LEADER, BOUND)
    assert leader.partition.high_watermark == 0  # b has acknowledged nothing yet
    header, payload = await replica_fetch(conn, 0)
    assert header == ReplicaFetchResponse(0, 0, 3, 3)  # the fetch at 0 acknowledges nothing: HW stays 0
    assert payload == leader.log.read(0, 1 << 20)
    assert [h.base_offset for _, h in iter_batches(payload)] == [0, 2]
    assert all(h.leader_epoch == 3 for _, h in iter_batches(payload))
    header, payload = await replica_fetch(conn, 3)  # b now holds 0..2: its fetch at 3 commits them
    assert (header.high_watermark, payload) == (3, b"")


async def test_the_fetch_offset_is_the_acknowledgement_an_acks_all_append_waits_for(
    leader: Leader, conn: Connection
) -> None:
    appending = asyncio.create_task(leader.append(b"v", acks=Acks.ALL))
    header, payload = await replica_fetch(conn, 0, wait_ms=int(BOUND * 1000))
    assert payload and not appending.done()
    await asyncio.sleep(0)  # give the append every chance to finish wrongly
    assert not appending.done()
    header, _ = await replica_fetch(conn, 1)
    assert header.high_watermark == 1
    assert await asyncio.wait_for(appending, BOUND) == 0


async def test_a_long_poll_at_the_tail_answers_as_soon_as_a_write_lands(leader: Leader, conn: Connection) -> None:
    started = time.monotonic()
    polling = asyncio.create_task(replica_fetch(conn, 0, wait_ms=int(BOUND * 1000)))
    await asyncio.sleep(0.05)
    assert not polling.done()
    await leader.append(b"now")
    header, payload = await asyncio.wait_for(polling, BOUND)
    assert header.log_end == 1 and payload == leader.log.read(0, 1 << 20)
    assert time.monotonic() - started < BOUND / 4


async def test_a_long_poll_at_the_tail_is_answered_from_the_write_itself(
    leader: Leader, conn: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    polling = asyncio.create_task(replica_fetch(conn, 0, wait_ms=int(BOUND * 1000)))
    await asyncio.sleep(0.05)

    def no_reading_back(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the tail fetch read the log back instead of taking the write's batches")

    monkeypatch.setattr(Log, "read_range", no_reading_back)
    monkeypatch.setattr(Log, "read", no_reading_back)
    await leader.append(b"now", b"and")
    header, payload = await asyncio.wait_for(polling, BOUND)
    monkeypatch.undo()
    assert header == ReplicaFetchResponse(0, 0, 2, 3)
    assert payload == leader.log.read(0, 1 << 20)  # byte for byte as stored, offsets and epoch included


async def test_a_write_into_zero_filled_room_is_pushed_with_the_log_end_it_makes(tmp_path: Path) -> None:
    # Such a write reaches the followers just before the leader's own pwritev (the leader's write observer is
    # told before the write): the answer must still carry the log end as it is once the write is in.
    log = Log.open(tmp_path / "leader", LogConfig(flush_policy=FlushPolicy.ALWAYS))
    log._append_rate.add(0, -RATE_WINDOW_NS)  # a writer waiting for each fsync, not a stream: room gets filled
    log._append_rate.add(0, 0)
    started = await start_leader(log, epoch=3)
    try:
        await started.append(b"grows the file")
        deadline = time.monotonic() + BOUND
        active = log._segments[-1]
        while active.preallocation.running or active.preallocation.allocated <= active.size:
            assert time.monotonic() < deadline, "no zero-filled room after the first write"
            await asyncio.sleep(0.005)
        conn = await Connection.open("127.0.0.1", started.port)
        try:
            polling = asyncio.create_task(replica_fetch(conn, 1, wait_ms=int(BOUND * 1000)))
            await asyncio.sleep(0.05)
            await started.append(b"into", b"the room")
            header, payload = await asyncio.wait_for(polling, BOUND)
        finally:
            await conn.close()
        assert (header.log_start, header.log_end, header.leader_epoch) == (0, 3, 3)
        assert payload == log.read(1, 1 << 20)
    finally:
        await started.close()


async def test_a_write_over_the_fetchs_max_bytes_is_read_back_from_the_log(leader: Leader, conn: Connection) -> None:
    request = ReplicaFetchRequest("s", 0, "b", 0, 3, max_bytes=1, max_wait_ms=int(BOUND * 1000))
    polling = asyncio.create_task(conn.request(request, timeout=BOUND))
    await asyncio.sleep(0.05)
    await leader.append(b"x" * 100)
    response = await asyncio.wait_for(polling, BOUND)
    assert isinstance(response.header, ReplicaFetchResponse) and response.header.log_end == 1
    assert bytes(response.payload) == leader.log.read(0, 1 << 20)  # still at least one whole batch


async def test_a_long_poll_times_out_empty(leader: Leader, conn: Connection) -> None:
    header, payload = await replica_fetch(conn, 0, wait_ms=30)
    assert (header, payload) == (ReplicaFetchResponse(0, 0, 0, 3), b"")
    assert leader.partition._tail_waiters == {}  # it left the partition's waiters


def _handler_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if getattr(t.get_coro(), "__qualname__", "") == "Session._handle"]


async def _parked(leader: Leader, offset: int) -> None:
    """Wait (bounded) until a fetch waits at ``offset`` among the partition's waiters."""
    deadline = time.monotonic() + BOUND
    while not leader.partition._tail_waiters.get(offset):
        assert time.monotonic() < deadline, f"no fetch parked at {offset}"
        await asyncio.sleep(0.005)


async def test_a_fetch_waiting_at_the_tail_has_no_handler_task(leader: Leader, conn: Connection) -> None:
    polling = asyncio.create_task(replica_fetch(conn, 0, wait_ms=int(BOUND * 1000)))
    await _parked(leader, 0)
    assert _handler_tasks() == []  # a future, a timer and a place among the waiters: nothing runs meanwhile
    await leader.append(b"now")
    header, payload = await asyncio.wait_for(polling, BOUND)
    assert header.log_end == 1 and payload == leader.log.read(0, 1 << 20)
    assert leader.partition._tail_waiters == {}


async def test_a_waiting_fetch_the_session_cannot_answer_at_once_is_read_back_from_the_log(
    leader: Leader, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As when the connection's transport still holds earlier bytes: the reply must wait its turn in the FIFO.
    # Patched before the connection opens: a session hands its handlers its reply_now when it starts.
    monkeypatch.setattr(Session, "reply_now", lambda _self, _slot, _reply: False)
    connection = await Connection.open("127.0.0.1", leader.port)
    try:
        polling = asyncio.create_task(replica_fetch(connection, 0, wait_ms=int(BOUND * 1000)))
        await _parked(leader, 0)
        await leader.append(b"late", b"but whole")
        header, payload = await asyncio.wait_for(polling, BOUND)
    finally:
        await connection.close()
    assert header.log_end == 2 and payload == leader.log.read(0, 1 << 20)


async def test_a_fetch_waiting_when_its_follower_goes_leaves_the_partitions_waiters(leader: Leader) -> None:
    connection = await Connection.open("127.0.0.1", leader.port)
    polling = asyncio.create_task(replica_fetch(connection, 0, wait_ms=int(BOUND * 1000)))
    await _parked(leader, 0)
    await connection.close()
    with pytest.raises(ConnectionClosedError):
        await asyncio.wait_for(polling, BOUND)
    deadline = time.monotonic() + BOUND
    while leader.partition._tail_waiters:
        assert time.monotonic() < deadline, "the gone follower's fetch still waits at the tail"
        await asyncio.sleep(0.005)
    assert await leader.append(b"still served") == 0


async def test_a_fetch_waiting_while_the_partition_closes_is_answered_unavailable(
    leader: Leader, conn: Connection
) -> None:
    polling = asyncio.create_task(replica_fetch(conn, 0, wait_ms=int(BOUND * 1000)))
    await _parked(leader, 0)
    await leader.partition.close(close_log=False)
    with pytest.raises(UnavailableError, match="closing or changing leader"):
        await asyncio.wait_for(polling, BOUND)
    assert leader.partition._tail_waiters == {}


@pytest.mark.parametrize(
    ("epoch", "code"), [(2, ErrorCode.FENCED_LEADER_EPOCH), (4, ErrorCode.NOT_LEADER)], ids=["older", "newer"]
)
async def test_another_leader_epoch_is_refused_and_acknowledges_nothing(
    leader: Leader, conn: Connection, epoch: int, code: ErrorCode
) -> None:
    await leader.append(b"v")
    header, payload = await replica_fetch(conn, 1, epoch=epoch)
    assert header.error is not None and header.error.code == code and header.error.retriable
    assert (header.leader_epoch, header.log_end, payload) == (3, 1, b"")
    assert leader.partition.high_watermark == 0  # the fetch at 1 was not counted
    state = leader.partition.followers.state("b")
    assert state is not None and state.log_end == -1


async def test_a_broker_that_is_no_replica_is_refused(leader: Leader, conn: Connection) -> None:
    await leader.append(b"v")
    header, payload = await replica_fetch(conn, 1, replica="z")
    assert header.error is not None and header.error.code == ErrorCode.NOT_LEADER
    assert "not a follower" in header.error.message and payload == b""
    assert leader.partition.high_watermark == 0


async def test_an_offset_below_the_log_start_answers_out_of_range_with_the_bounds(
    leader: Leader, conn: Connection
) -> None:
    await sealed_segments(leader, 1)
    await leader.log.delete_segments_before(3)
    header, payload = await replica_fetch(conn, 1)
    assert header.error is not None and header.error.code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert (header.log_start, header.log_end, payload) == (3, 4, b"")
    assert leader.partition.high_watermark == 0
    leader.partition.check_appendable()  # behind is no evidence of anything


async def epoch_end(conn: Connection, epoch: int, current: int = 3) -> EpochEndOffsetResponse:
    response = await conn.request(EpochEndOffsetRequest("s", 0, "b", epoch, current), timeout=BOUND)
    assert isinstance(response.header, EpochEndOffsetResponse)
    return response.header


async def test_a_fetch_beyond_the_log_end_suspends_appends_and_the_follower_keeps_its_log(
    leader: Leader, conn: Connection
) -> None:
    await leader.append(b"v", b"w")
    header, payload = await replica_fetch(conn, 5)
    # Not OFFSET_OUT_OF_RANGE, on which a follower cuts its log to the leader's end: it may hold the only copy.
    assert header.error is not None and header.error.code == ErrorCode.PARTITION_SUSPENDED
    assert "replica b fetched from offset 5, beyond the log end 2 of leader a (epoch 3)" in header.error.message
    assert not header.error.retriable
    assert (header.log_start, header.log_end, payload) == (0, 2, b"")
    with pytest.raises(PartitionSuspendedError, match="reset-head s 0"):
        await leader.append(b"refused")
    # While suspended, a follower asking where its epoch ends would cut its log to the answer: refused too.
    refused = await epoch_end(conn, 3)
    assert refused.error is not None and refused.error.code == ErrorCode.PARTITION_SUSPENDED
    assert (refused.leader_epoch, refused.end_offset) == (3, -1)
    header, payload = await replica_fetch(conn, 1)  # within the log: served as ever (the batch holding 1)
    assert header.error is None and payload == leader.log.read(0, 1 << 20)


async def test_beyond_a_head_confirmed_for_this_leadership_a_follower_is_told_to_cut(
    leader: Leader, conn: Connection
) -> None:
    record = msgspec.structs.replace(leader.partition.record, head_epoch=3, head_offset=2)
    leader.partition.update_record(record)
    await leader.append(b"v", b"w")
    header, _ = await replica_fetch(conn, 5)
    assert header.error is not None and header.error.code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert header.log_end == 2
    leader.partition.check_appendable()
    # An epoch this leader never had ends at its log start: the follower copies the confirmed log whole.
    assert await epoch_end(conn, 1) == EpochEndOffsetResponse(1, 0)
    assert await epoch_end(conn, 3) == EpochEndOffsetResponse(3, 2)  # a known one as ever


async def test_an_unknown_stream_is_an_error_frame(conn: Connection) -> None:
    with pytest.raises(UnknownStreamError):
        await conn.request(ReplicaFetchRequest("nope", 0, "b", 0, 3), timeout=BOUND)


async def test_epoch_end_offset_answers_from_the_leaders_epoch_cache(tmp_path: Path) -> None:
    log = open_log(tmp_path / "leader")
    for epoch, count in [(0, 2), (2, 3)]:
        for _ in range(count):
            await log.append(batch(b"e%d" % epoch), leader_epoch=epoch)
    leader = await start_leader(log, epoch=5)
    connection = await Connection.open("127.0.0.1", leader.port)
    try:

        async def ask(epoch: int, current: int = -1) -> EpochEndOffsetResponse:
            response = await connection.request(EpochEndOffsetRequest("s", 0, "b", epoch, current), timeout=BOUND)
            assert isinstance(response.header, EpochEndOffsetResponse)
            return response.header

        assert await ask(0) == EpochEndOffsetResponse(0, 2)  # epoch 0 ends where epoch 2 starts
        assert await ask(1) == EpochEndOffsetResponse(0, 2)  # never saw 1: the largest below it (KIP-279)
        assert await ask(2) == EpochEndOffsetResponse(2, 5)  # the latest ends at the log end
        assert await ask(4) == EpochEndOffsetResponse(-1, -1)  # above every epoch the log holds
        assert await ask(-1) == EpochEndOffsetResponse(-1, -1)
        assert await ask(2, current=5) == EpochEndOffsetResponse(2, 5)
        fenced = await ask(2, current=4)
        assert fenced.error is not None and fenced.error.code == ErrorCode.FENCED_LEADER_EPOCH
        assert (fenced.leader_epoch, fenced.end_offset) == (5, -1)
    finally:
        await connection.close()
        await leader.close()


# -- far-horizon catch-up: SEGMENT_LIST and SEGMENT_FETCH ---------------------------------------------------------


async def sealed_segments(leader: Leader, count: int) -> None:
    """Write ``count`` sealed segments of two batches each, then one batch into the active segment."""
    for i in range(count):
        await leader.append(b"s%d-a" % i)
        await leader.append(b"s%d-b" % i, b"more")
        await leader.log.roll()
    await leader.append(b"active")


async def segment_list(conn: Connection, offset: int, *, epoch: int = 3, replica: str = "b") -> SegmentListResponse:
    response = await conn.request(SegmentListRequest("s", 0, replica, offset, epoch), timeout=BOUND)
    assert isinstance(response.header, SegmentListResponse)
    return response.header


async def segment_fetch(
    conn: Connection, base: int, position: int = 0, max_bytes: int = 1 << 20, *, file_id: int = 0, epoch: int = 3
) -> tuple[SegmentFetchResponse, bytes]:
    request = SegmentFetchRequest("s", 0, "b", epoch, base, position, max_bytes, file_id)
    response = await conn.request(request, timeout=BOUND)
    assert isinstance(response.header, SegmentFetchResponse)
    return response.header, bytes(response.payload)


async def test_segment_list_names_the_sealed_segments_from_an_offset(leader: Leader, conn: Connection) -> None:
    await sealed_segments(leader, 3)
    infos = leader.log.segments
    listing = await segment_list(conn, 0)
    assert [(s.base_offset, s.next_offset, s.size, s.max_timestamp) for s in listing.segments] == [
        (i.base_offset, i.next_offset, i.size, i.max_timestamp) for i in infos[:-1]
    ]
    assert (listing.log_start, listing.log_end, listing.leader_epoch) == (0, 10, 3)
    assert [s.base_offset for s in (await segment_list(conn, 4)).segments] == [3, 6]  # 4 lies inside [3, 6)
    assert (await segment_list(conn, 9)).segments == ()  # the active segment is never listed
    assert leader.partition.high_watermark == 0  # listing acknowledges nothing


@pytest.mark.parametrize(("epoch", "replica"), [(2, "b"), (4, "b"), (3, "z")], ids=["older", "newer", "no-replica"])
async def test_segment_requests_are_fenced_like_replica_fetch(
    leader: Leader, conn: Connection, epoch: int, replica: str
) -> None:
    await sealed_segments(leader, 1)
    listing = await segment_list(conn, 0, epoch=epoch, replica=replica)
    assert listing.error is not None and listing.segments == ()
    request = SegmentFetchRequest("s", 0, replica, epoch, 0, 0, 1 << 20)
    response = await conn.request(request, timeout=BOUND)
    assert isinstance(response.header, SegmentFetchResponse)
    assert response.header.error is not None and response.header.error.code == listing.error.code
    assert bytes(response.payload) == b""


async def test_segment_fetch_serves_the_files_raw_bytes_in_chunks(leader: Leader, conn: Connection) -> None:
    await sealed_segments(leader, 2)
    info = leader.log.segments[1]
    on_disk = info.path.read_bytes()
    header, first = await segment_fetch(conn, info.base_offset, 0, 50)
    assert (header.size, header.error, first) == (len(on_disk), None, on_disk[:50])
    header2, rest = await segment_fetch(conn, info.base_offset, 50, 1 << 20, file_id=header.file_id)
    assert first + rest == on_disk and header2.file_id == header.file_id
    _, beyond = await segment_fetch(conn, info.base_offset, len(on_disk))
    assert beyond == b""


async def test_segment_fetch_of_a_deleted_active_or_rewritten_segment_is_out_of_range(
    leader: Leader, conn: Connection
) -> None:
    await sealed_segments(leader, 2)
    header, _ = await segment_fetch(conn, 0)
    wrong_id, _ = await segment_fetch(conn, 0, 10, file_id=header.file_id + 1)  # as after a compaction
    active, _ = await segment_fetch(conn, 6)
    await leader.log.delete_segments_before(3)
    deleted, payload = await segment_fetch(conn, 0, 10, file_id=header.file_id)
    for response in (wrong_id, active, deleted):
        assert response.error is not None and response.error.code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert deleted.log_start == 3 and payload == b""
