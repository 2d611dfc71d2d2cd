"""The gRPC ``tidelog.v1.Appender`` against a real broker: all or nothing, expectations, registers, aborts.

Written as a client in another language would use it: a stub from the generated module, messages built by
hand, Liftbridge ``Subscribe`` (or the wire consumer, where null keys and repeated headers matter) to read back.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
import pytest_asyncio

from tests.broker.helpers import bounded, create_stream, expect_code, read_until_stop, values
from tests.helpers import BOUND
from tidelog.broker.appends.streamed import OpenAppend
from tidelog.client import Consumer
from tidelog.protocol._gen import api_pb2_grpc
from tidelog.protocol._gen.tidelog.v1 import append_pb2 as pb
from tidelog.protocol._gen.tidelog.v1 import append_pb2_grpc
from tidelog.protocol.errors import ErrorCode
from tidelog.server import Broker

pytestmark = pytest.mark.asyncio(loop_scope="module")

WINDOW_MS = 2000
"""The broker's append_rate_window_ms here: a stalled append is refused within two seconds."""

Appender = append_pb2_grpc.AppenderStub


@pytest.fixture(scope="module")
def broker_settings() -> dict[str, Any]:
    return {"append_rate_window_ms": WINDOW_MS}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def appender(broker: Broker) -> AsyncIterator[Appender]:
    assert broker.grpc is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.grpc.port}") as channel:
        await bounded(channel.channel_ready())
        yield Appender(channel)


def header(stream: str, **fields: Any) -> pb.AppendRequest:
    return pb.AppendRequest(header=pb.AppendHeader(stream=stream, **fields))


def labels(**pairs: str) -> pb.LabelSet:
    return pb.LabelSet(labels=[pb.Label(name=name, value=value) for name, value in pairs.items()])


def plain(*values: bytes) -> list[pb.Record]:
    return [pb.Record(value=value) for value in values]


def commit(*records: pb.Record) -> pb.AppendRequest:
    return pb.AppendRequest(records=records, commit=True)


async def append(appender: Appender, *messages: pb.AppendRequest) -> pb.AppendResponse:
    response: pb.AppendResponse = await bounded(appender.Append(iter(messages)))
    return response


async def once(appender: Appender, stream: str, *records: bytes, **fields: Any) -> pb.AppendResponse:
    """A one-message append: the header, the records and the commit together."""
    message = header(stream, **fields)
    message.records.extend(plain(*records))
    message.commit = True
    return await append(appender, message)


def outcome(response: pb.AppendResponse) -> tuple[str, int, int, int]:
    return pb.Status.Name(response.status), response.base_offset, response.last_offset, response.log_end


def registers(response: pb.AppendResponse) -> dict[str, str]:
    return {label.name: label.value for label in response.registers.labels}


async def read_values(stub: api_pb2_grpc.APIStub, stream: str) -> list[bytes]:
    return values(await read_until_stop(stub, stream))


async def until(broker: Broker, condition: Callable[[tuple[OpenAppend, ...]], bool]) -> None:
    """Wait, bounded, for a condition on the broker's open gRPC appends (the broker lives in this process)."""
    assert broker.grpc is not None
    await bounded(broker.grpc.appends.wait_for(condition))


def received(at_least: int) -> Callable[[tuple[OpenAppend, ...]], bool]:
    return lambda appends: sum(open_append.received for open_append in appends) >= at_least


def none_open(appends: tuple[OpenAppend, ...]) -> bool:
    return not appends


async def test_an_append_lands_whole_at_contiguous_offsets(
    broker: Broker, stub: api_pb2_grpc.APIStub, appender: Appender, stream_name: str
) -> None:
    await create_stream(stub, stream_name)
    first = header(stream_name)
    first.records.extend(
        [
            pb.Record(key=b"k", value=b"a", timestamp=1_700_000_000_000_000_000),
            pb.Record(
                value=b"b", headers=[pb.RecordHeader(name="h", value=b"1"), pb.RecordHeader(name="h", value=b"2")]
            ),
        ]
    )
    response = await append(appender, first, pb.AppendRequest(records=plain(b"c")), commit(*plain(b"d")))
    assert outcome(response) == ("STATUS_OK", 0, 3, 4) and registers(response) == {}
    assert outcome(await once(appender, stream_name, b"e")) == ("STATUS_OK", 4, 4, 5)

    assert await read_values(stub, stream_name) == [b"a", b"b", b"c", b"d", b"e"]
    assert broker.wire is not None
    async with Consumer(f"127.0.0.1:{broker.wire.port}", stream_name, stop_at_end=True) as consumer:
        async with asyncio.timeout(BOUND):
            records = [record async for record in consumer]
    assert [r.offset for r in records] == [0, 1, 2, 3, 4]
    assert (records[0].key, records[0].timestamp) == (b"k", 1_700_000_000_000_000_000)
    assert records[1].key is None and records[1].headers == (("h", b"1"), ("h", b"2"))
    assert records[1].timestamp > 1_700_000_000_000_000_000  # no timestamp: when the broker got the header


async def test_an_open_append_is_invisible_until_its_commit(
    broker: Broker, stub: api_pb2_grpc.APIStub, appender: Appender, stream_name: str
) -> None:
    await create_stream(stub, stream_name)
    call = appender.Append()
    await bounded(call.write(header(stream_name)))
    await bounded(call.write(pb.AppendRequest(records=plain(b"x", b"y"))))
    await until(broker, received(1))
    assert await read_values(stub, stream_name) == []
    assert broker.manager.leader_of(stream_name, 0).log.end_offset == 0  # spooled, not in the log
    await bounded(call.write(commit(*plain(b"z"))))
    assert outcome(await bounded(call)) == ("STATUS_OK", 0, 2, 3)
    assert await read_values(stub, stream_name) == [b"x", b"y", b"z"]


async def test_expected_offset_mismatch_reports_the_end_and_writes_nothing(
    stub: api_pb2_grpc.APIStub, appender: Appender, stream_name: str
) -> None:
    await create_stream(stub, stream_name)
    assert outcome(await once(appender, stream_name, b"a", b"b", expected_offset=0)) == ("STATUS_OK", 0, 1, 2)
    assert outcome(await once(appender, stream_name, b"c")) == ("STATUS_OK", 2, 2, 3)  # unset is not 0

    behind = await once(appender, stream_name, b"lost", expected_offset=0)
    assert outcome(behind) == ("STATUS_INCORRECT_OFFSET", -1, -1, 3)
    assert "ends at 3" in behind.message
    ahead = await once(appender, stream_name, b"lost", expected_offset=7)  # decided at commit, not at the header
    assert outcome(ahead) == ("STATUS_INCORRECT_OFFSET", -1, -1, 3)

    assert outcome(await once(appender, stream_name, b"d", expected_offset=3)) == ("STATUS_OK", 3, 3, 4)
    assert await read_values(stub, stream_name) == [b"a", b"b", b"c", b"d"]


async def test_a_passed_expected_offset_is_answered_before_the_commit(
    stub: api_pb2_grpc.APIStub, appender: Appender, stream_name: str
) -> None:
    await create_stream(stub, stream_name)
    await once(appender, stream_name, b"a")
    call = appender.Append()
    await bounded(call.write(header(stream_name, expected_offset=0)))
    response = await bounded(call)  # the client has not committed, nor closed its side
    assert outcome(response) == ("STATUS_INCORRECT_OFFSET", -1, -1, 1)
    assert await read_values(stub, stream_name) == [b"a"]


async def test_two_writers_fence_each_other_with_a_register(
    stub: api_pb2_grpc.APIStub, appender: Appender, stream_name: str
) -> None:
    """Gazette's fencing: each writer checks ``author=<me>`` and takes over with ``union author=<me>``; once B
    has taken over, A's appends are refused and only the holder's land."""
    await create_stream(stub, stream_name)

    def check(me: str) -> pb.LabelSelector:
        return pb.LabelSelector(include=labels(author=me))

    taken = await once(appender, stream_name, b"a1", check_registers=check("a"), union_registers=labels(author="a"))
    assert outcome(taken) == ("STATUS_OK", 0, 0, 1) and registers(taken) == {"author": "a"}
    assert outcome(await once(appender, stream_name, b"a2", check_registers=check("a"))) == ("STATUS_OK", 1, 1, 2)

    refused = await once(appender, stream_name, b"b1", check_registers=check("b"))
    assert outcome(refused) == ("STATUS_REGISTER_MISMATCH", -1, -1, 2) and registers(refused) == {"author": "a"}

    took_over = await once(appender, stream_name, b"b1", union_registers=labels(author="b"))
    assert registers(took_over) == {"author": "b"}
    fenced = await once(appender, stream_name, b"a3", check_registers=check("a"))
    assert outcome(fenced) == ("STATUS_REGISTER_MISMATCH", -1, -1, 3) and registers(fenced) == {"author": "b"}
    assert outcome(await once(appender, stream_name, b"b2", check_registers=check("b")))[0] == "STATUS_OK"

    released = await once(appender, stream_name, b"b3", subtract_registers=labels(author="b"))
    assert registers(released) == {}
    assert await read_values(stub, stream_name) == [b"a1", b"a2", b"b1", b"b2", b"b3"]


async def test_a_cancelled_append_writes_nothing_and_uses_no_offsets(
    broker: Broker, stub: api_pb2_grpc.APIStub, appender: Appender, stream_name: str
) -> None:
    await create_stream(stub, stream_name)
    assert broker.grpc is not None
    chunk = plain(*(os.urandom(1000) for _ in range(250)))  # ~250 kB per message; 6 of them go to a spool file
    call = appender.Append()
    await bounded(call.write(header(stream_name)))
    for _ in range(6):
        await bounded(call.write(pb.AppendRequest(records=chunk)))
    await until(broker, received(6 * 250 * 1000))
    (spooled,) = broker.grpc.appends.in_flight()
    call.cancel()
    await until(broker, none_open)
    assert spooled.failure is not None  # decided as dropped: its spool file is closed, nothing can commit it

    assert outcome(await once(appender, stream_name, b"after")) == ("STATUS_OK", 0, 0, 1)
    assert await read_values(stub, stream_name) == [b"after"]


async def test_a_dropped_connection_or_a_stream_without_commit_writes_nothing(
    broker: Broker, stub: api_pb2_grpc.APIStub, appender: Appender, stream_name: str
) -> None:
    await create_stream(stub, stream_name)
    assert broker.grpc is not None
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{broker.grpc.port}")
    call = Appender(channel).Append()
    await bounded(call.write(header(stream_name)))
    await bounded(call.write(pb.AppendRequest(records=plain(b"dropped"))))
    await until(broker, received(1))
    await channel.close()
    await until(broker, none_open)

    forgot = await append(appender, header(stream_name), pb.AppendRequest(records=plain(b"uncommitted")))
    assert outcome(forgot) == ("STATUS_INVALID_ARGUMENT", -1, -1, 0) and "without" in forgot.message

    assert outcome(await once(appender, stream_name, b"kept")) == ("STATUS_OK", 0, 0, 1)
    assert await read_values(stub, stream_name) == [b"kept"]


async def test_a_stalled_append_is_refused_without_waiting_for_the_client(
    broker: Broker, stub: api_pb2_grpc.APIStub, appender: Appender, stream_name: str
) -> None:
    await create_stream(stub, stream_name)
    call = appender.Append()
    await bounded(call.write(header(stream_name)))
    await bounded(call.write(pb.AppendRequest(records=plain(b"trickle"))))
    response = await bounded(call, 3 * WINDOW_MS / 1000 + BOUND)  # the client never sends again
    assert response.status == ErrorCode.APPEND_TOO_SLOW and "append_min_rate_bytes" in response.message
    assert broker.grpc is not None and not broker.grpc.appends.in_flight()
    assert outcome(await once(appender, stream_name, b"next")) == ("STATUS_OK", 0, 0, 1)


async def test_requests_that_name_no_append_end_the_call_with_a_grpc_status(
    stub: api_pb2_grpc.APIStub, appender: Appender, stream_name: str
) -> None:
    await create_stream(stub, stream_name)
    await expect_code(grpc.StatusCode.NOT_FOUND, once(appender, "no-such-stream-for-grpc-appends", b"x"))
    await expect_code(grpc.StatusCode.NOT_FOUND, once(appender, stream_name, b"x", partition=3))
    await expect_code(grpc.StatusCode.INVALID_ARGUMENT, append(appender, commit(*plain(b"no header"))))
    bad = pb.LabelSet(labels=[pb.Label(name="a", value="too short a name")])
    details = await expect_code(
        grpc.StatusCode.INVALID_ARGUMENT, once(appender, stream_name, b"x", union_registers=bad)
    )
    assert "union_registers" in details

    second = await append(appender, header(stream_name), header(stream_name), commit())
    assert outcome(second) == ("STATUS_INVALID_ARGUMENT", -1, -1, 0)
    assert await read_values(stub, stream_name) == []


async def test_an_append_without_records_reads_the_registers_and_changes_nothing(
    stub: api_pb2_grpc.APIStub, appender: Appender, stream_name: str
) -> None:
    await create_stream(stub, stream_name)
    await once(appender, stream_name, b"x", union_registers=labels(owner="me"))
    empty = await once(appender, stream_name, union_registers=labels(owner="you"))
    assert outcome(empty) == ("STATUS_OK", -1, -1, 1) and registers(empty) == {"owner": "me"}
