"""PublishAsync in batches (issue 26): requests that arrive together are one log append, their answers come back in
request order with each message's own offset, error and correlation id, and a client that stops reading its
answers stops being read.

The batching tests call :func:`tidelog.api.rpc.publish_batches.publish_async` on the broker's own context with a
request iterator that never waits: every request has arrived before the first is written, which makes "arrived
together" certain rather than a matter of timing. The rest goes through gRPC as a client sees it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.broker.helpers import Stub, bounded, create_stream, read_until_stop
from tests.helpers import BOUND
from tidelog.api.rpc import publish_batches
from tidelog.api.rpc.publish_batches import ANSWERED_RUNS, MAX_GROUP, MAX_PENDING, runs
from tidelog.protocol._gen import api_pb2
from tidelog.protocol.messages import Acks
from tidelog.protocol.records import iter_batches
from tidelog.server import Broker

pytestmark = pytest.mark.asyncio(loop_scope="module")

Request = api_pb2.PublishRequest


async def arrived(requests: list[Request]) -> AsyncIterator[Request]:
    for request in requests:
        yield request


async def answers(broker: Broker, requests: list[Request]) -> list[api_pb2.PublishResponse]:
    assert broker.context is not None

    async def collect() -> list[api_pb2.PublishResponse]:
        return [r async for r in publish_batches.publish_async(broker.context, arrived(requests))]  # type: ignore[arg-type]

    return await bounded(collect())


def batch_count(broker: Broker, stream: str) -> int:
    partition = broker.manager.leader_of(stream, 0)
    data = partition.read_committed(0, 64 * 1024 * 1024)
    return sum(1 for _ in iter_batches(data))


async def test_runs_split_by_partition_and_write_acks() -> None:
    def r(stream: str, partition: int = 0, policy: int = api_pb2.LEADER) -> Request:
        return Request(stream=stream, partition=partition, ackPolicy=policy)  # type: ignore[arg-type]

    group = [r("a"), r("a", policy=api_pb2.NONE), r("a", policy=api_pb2.ALL), r("a", 1), r("b"), r("a")]
    assert [[(q.stream, q.partition, int(q.ackPolicy)) for q in run] for run in runs(group)] == [
        [("a", 0, Acks.LEADER), ("a", 0, Acks.NONE)],  # NONE is written like LEADER: one run
        [("a", 0, Acks.ALL)],
        [("a", 1, Acks.LEADER)],
        [("b", 0, Acks.LEADER)],
        [("a", 0, Acks.LEADER)],  # runs never reorder: a comes back after b
    ]


async def test_requests_arriving_together_are_one_append(broker: Broker, stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    count = 300
    requests = [Request(stream=stream_name, value=b"v%d" % i, correlationId=f"c{i}") for i in range(count)]
    responses = await answers(broker, requests)
    assert [r.correlationId for r in responses] == [f"c{i}" for i in range(count)]  # in request order
    assert [r.ack.offset for r in responses] == list(range(count))
    assert all(r.ack.correlationId == r.correlationId for r in responses)
    assert batch_count(broker, stream_name) == 1  # one per message before batching
    stored = await read_until_stop(stub, stream_name)
    assert [(m.offset, m.value, m.correlationId) for m in stored] == [(i, b"v%d" % i, f"c{i}") for i in range(count)]


async def test_more_than_a_group_takes_more_batches(broker: Broker, stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    count = MAX_GROUP + 10
    responses = await answers(broker, [Request(stream=stream_name, value=b"x") for _ in range(count)])
    assert [r.ack.offset for r in responses] == list(range(count))
    assert batch_count(broker, stream_name) == 2


async def test_each_message_keeps_its_own_policy_error_and_offset(broker: Broker, stub: Stub, stream_name: str) -> None:
    other = f"{stream_name}-other"
    await create_stream(stub, stream_name)
    await create_stream(stub, other)

    def request(cid: str, stream: str = stream_name, **fields: Any) -> Request:
        return Request(stream=stream, value=fields.pop("value", cid.encode()), correlationId=cid, **fields)

    responses = await answers(
        broker,
        [
            request("leader-0"),
            request("bad-policy", ackPolicy=9),
            request("none-1", ackPolicy=api_pb2.NONE),
            request("reserved-header", headers={"_tl.corr": b"x"}),
            request("leader-2"),
            request("all-3", ackPolicy=api_pb2.ALL),
            request("other-0", stream=other),
            request("missing", stream=f"{stream_name}-missing"),
            request("leader-4"),
        ],
    )
    got = [(r.correlationId, r.asyncError.code if r.HasField("asyncError") else r.ack.offset) for r in responses]
    assert got == [
        ("leader-0", 0),
        ("bad-policy", api_pb2.PublishAsyncError.BAD_REQUEST),
        # none-1 is stored at offset 1 and has no answer
        ("reserved-header", api_pb2.PublishAsyncError.BAD_REQUEST),
        ("leader-2", 2),
        ("all-3", 3),
        ("other-0", 0),
        ("missing", api_pb2.PublishAsyncError.NOT_FOUND),
        ("leader-4", 4),
    ]
    by_id = {r.correlationId: r for r in responses}
    assert by_id["all-3"].ack.ackPolicy == api_pb2.ALL and by_id["all-3"].ack.commitTimestamp > 0
    assert [m.correlationId for m in await read_until_stop(stub, stream_name)] == [
        "leader-0",
        "none-1",
        "leader-2",
        "all-3",
        "leader-4",
    ]


async def test_a_client_not_reading_answers_is_not_read(broker: Broker, stub: Stub, stream_name: str) -> None:
    """Backpressure: with the answers unread, the requests taken from the client stop at the two bounded queues
    and one group in hand, however many the client has to send."""
    assert broker.context is not None
    await create_stream(stub, stream_name)
    pulled = 0

    async def endless() -> AsyncIterator[Request]:
        nonlocal pulled
        while True:
            pulled += 1
            yield Request(stream=stream_name, value=b"x", correlationId=str(pulled))

    batches = publish_batches.PublishBatches(broker.context)
    answers = batches.serve(endless())
    try:
        first = await bounded(answers.__anext__())
        assert first.correlationId == "1"
        deadline = time.monotonic() + BOUND
        while not batches.saturated():  # both queues full: nothing more can be taken
            assert time.monotonic() < deadline, f"the queues never filled ({pulled} requests pulled)"
            await asyncio.sleep(0.01)
        assert pulled <= MAX_PENDING + (ANSWERED_RUNS + 2) * MAX_GROUP + 2  # queued, answered, one in hand
    finally:
        await answers.aclose()
