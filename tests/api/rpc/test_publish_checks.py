"""Publish's checks of ``ackInbox``, ``ackPolicy`` and ``PublishToSubject``'s subject, against one real broker.

Each bad field is INVALID_ARGUMENT naming it, before anything is stored; and none of them can break the broker's
NATS connection, which every later ack and ``PublishToSubject`` of every partition shares.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from tests.broker.helpers import (
    Stub,
    bounded,
    create_stream,
    expect_code,
    partition_metadata,
    publish,
    read_until_stop,
    subscribed,
    values,
)
from tidelog.protocol._gen import api_pb2
from tidelog.protocol.envelope import MessageType, parse_envelope

pytestmark = pytest.mark.asyncio(loop_scope="module")

Code = grpc.StatusCode
LONG_INBOX = "_INBOX." + "x" * 5000  # beyond nats-server's default max control line (4096)


async def inbox_ack(stub: Stub, nc: Any, stream: str, inbox: str) -> api_pb2.Ack:
    """Publish with ``inbox`` as the ack inbox and return the ack that arrives there."""
    arrived: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def on_ack(msg: Any) -> None:
        if not arrived.done():
            arrived.set_result(msg.data)

    sub = await nc.subscribe(inbox, cb=on_ack)
    try:
        await subscribed(nc)
        await publish(stub, stream, b"acked", ackInbox=inbox)
        envelope = parse_envelope(await bounded(arrived))
    finally:
        await sub.unsubscribe()
    assert envelope is not None and envelope.msg_type is MessageType.ACK
    return api_pb2.Ack.FromString(bytes(envelope.payload))


@pytest.mark.parametrize("policy", [7, 300, -1])
async def test_an_ack_policy_outside_the_enum_is_invalid_argument(stub: Stub, stream_name: str, policy: int) -> None:
    await create_stream(stub, stream_name)
    details = await expect_code(Code.INVALID_ARGUMENT, publish(stub, stream_name, b"v", ackPolicy=policy))
    assert "ackPolicy" in details and "LEADER (0), ALL (1), NONE (2)" in details and str(policy) in details
    assert (await partition_metadata(stub, stream_name)).newestOffset == -1


@pytest.mark.parametrize(
    ("inbox", "what"),
    [
        ("a b", "whitespace"),
        ("a\tb", "whitespace"),
        ("a..b", "empty token"),
        (".a", "empty token"),
        ("a.*", "wildcard"),
        ("a.>", "wildcard"),
        (LONG_INBOX, "the limit is 1024"),
    ],
    ids=["space", "tab", "double-dot", "leading-dot", "star", "gt", "long"],
)
async def test_an_invalid_ack_inbox_is_refused_before_anything_is_stored(
    stub: Stub, nc: Any, stream_name: str, inbox: str, what: str
) -> None:
    await create_stream(stub, stream_name)
    details = await expect_code(Code.INVALID_ARGUMENT, publish(stub, stream_name, b"v", ackInbox=inbox))
    assert "ackInbox" in details and what in details
    assert len(details) < 400  # the inbox is quoted, not echoed whole
    assert (await partition_metadata(stub, stream_name)).newestOffset == -1
    # The broker's NATS connection still works: the next publish gets its ack on a valid inbox.
    ack = await inbox_ack(stub, nc, stream_name, f"{stream_name}.acks")
    assert ack.offset == 0


async def test_publish_to_subject_checks_its_subject_and_ack_fields(stub: Stub, nc: Any, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    for fields, field in [
        ({"subject": "x" * 5000}, "subject"),
        ({"subject": f"{stream_name}.*"}, "subject"),
        ({"subject": ""}, "subject"),
        ({"subject": stream_name, "ackPolicy": 9}, "ackPolicy"),
        ({"subject": stream_name, "ackInbox": LONG_INBOX}, "ackInbox"),
    ]:
        request = api_pb2.PublishToSubjectRequest(value=b"v", **fields)
        details = await expect_code(Code.INVALID_ARGUMENT, stub.PublishToSubject(request))
        assert field in details and len(details) < 400
    assert (await partition_metadata(stub, stream_name)).newestOffset == -1
    request = api_pb2.PublishToSubjectRequest(subject=stream_name, value=b"fine")
    assert (await bounded(stub.PublishToSubject(request))).ack.offset == 0
    assert values(await read_until_stop(stub, stream_name)) == [b"fine"]


async def test_publish_async_answers_a_bad_ack_policy_alone(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    requests = [
        api_pb2.PublishRequest(stream=stream_name, value=b"ok", correlationId="ok-1"),
        api_pb2.PublishRequest(stream=stream_name, value=b"bad", correlationId="bad", ackPolicy=300),
        api_pb2.PublishRequest(stream=stream_name, value=b"ok", correlationId="ok-2"),
    ]

    async def each() -> Any:
        for request in requests:
            yield request

    call = stub.PublishAsync(each())
    responses = [r async for r in call]
    by_id = {r.correlationId: r for r in responses}
    assert by_id["bad"].asyncError.code == api_pb2.PublishAsyncError.BAD_REQUEST
    assert "ackPolicy" in by_id["bad"].asyncError.message
    assert not by_id["ok-1"].HasField("asyncError") and not by_id["ok-2"].HasField("asyncError")
    assert values(await read_until_stop(stub, stream_name)) == [b"ok", b"ok"]
