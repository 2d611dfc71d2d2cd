"""NATS ingest: what plain NATS publishers and Liftbridge envelope publishers get from a stream.

One real broker for the module; messages go in through a plain nats-py client and come out through the gRPC
``Subscribe`` a Liftbridge client uses (or, for the bulk test, straight from the partition's log to count batches).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from tests.helpers import BOUND
from tidelog.protocol._gen import api_pb2
from tidelog.protocol.envelope import MAGIC, MessageType, encode_envelope
from tidelog.protocol.records import decode_records, iter_batches
from tidelog.server import Broker

from .helpers import (
    Stub,
    bounded,
    create_stream,
    envelope,
    inbox,
    offsets,
    parse_ack,
    read_until_stop,
    receive,
    subscription,
    values,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

NOTHING_WINDOW = 0.5
"""How long "no ack arrives" is watched for: the one timed wait of this module."""


# ---------------------------------------------------------------------------------------------- plain NATS messages


async def test_plain_messages_are_stored_whole(stub: Stub, nc: Any, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    await nc.publish(stream_name, b"no reply")
    await nc.publish(stream_name, b"with reply", reply=f"{stream_name}.reply")
    await nc.publish(stream_name, b"with headers", headers={"X-Trace": "abc"})
    await nc.publish(stream_name, MAGIC)  # starts like an envelope, is not one
    await nc.publish(stream_name, b"")

    got = await receive(stub, stream_name, 5)
    assert values(got) == [b"no reply", b"with reply", b"with headers", MAGIC, b""]
    assert offsets(got) == [0, 1, 2, 3, 4]
    assert [m.subject for m in got] == [stream_name] * 5
    assert [m.replySubject for m in got] == ["", f"{stream_name}.reply", "", "", ""]
    assert dict(got[2].headers) == {"X-Trace": b"abc"}
    assert all(m.key == b"" and not m.ackInbox and not m.correlationId for m in got)


async def test_plain_messages_read_back_from_every_start_position(stub: Stub, nc: Any, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    for i in range(5):
        await nc.publish(stream_name, b"n%d" % i)
    stamps = [m.timestamp for m in await receive(stub, stream_name, 5)]

    async def read(**fields: Any) -> list[int]:
        return offsets(await read_until_stop(stub, stream_name, **fields))

    assert await read(startPosition=api_pb2.EARLIEST) == [0, 1, 2, 3, 4]
    assert await read(startPosition=api_pb2.OFFSET, startOffset=2) == [2, 3, 4]
    assert await read(startPosition=api_pb2.LATEST) == [4]
    assert len(set(stamps)) == 5  # stamped on arrival, even when they share one batch
    assert await read(startPosition=api_pb2.TIMESTAMP, startTimestamp=stamps[3]) == [3, 4]
    assert await read(stopPosition=api_pb2.STOP_TIMESTAMP, stopTimestamp=stamps[1]) == [0, 1]
    assert await read(stopPosition=api_pb2.STOP_OFFSET, stopOffset=2) == [0, 1, 2]
    async with subscription(stub, stream_name, startPosition=api_pb2.NEW_ONLY) as tail:
        await nc.publish(stream_name, b"n5")
        message = await tail.next()
        assert (message.offset, message.value) == (5, b"n5")


# ---------------------------------------------------------------------------------------------- Liftbridge envelopes


@pytest.mark.parametrize("with_crc", [True, False], ids=["crc", "no-crc"])
async def test_envelopes_are_decoded(stub: Stub, nc: Any, stream_name: str, with_crc: bool) -> None:
    await create_stream(stub, stream_name)
    body = envelope(
        with_crc=with_crc,
        key=b"key",
        value=b"value",
        headers={"h1": b"one", "h2": b"\x00"},
        correlationId="corr-1",
        ackPolicy=api_pb2.NONE,
    )
    await nc.publish(stream_name, body, reply=f"{stream_name}.reply")

    (message,) = await receive(stub, stream_name, 1)
    assert (message.key, message.value, dict(message.headers)) == (b"key", b"value", {"h1": b"one", "h2": b"\x00"})
    assert (message.correlationId, message.ackPolicy, message.subject) == ("corr-1", api_pb2.NONE, stream_name)
    assert message.replySubject == f"{stream_name}.reply"


@pytest.mark.parametrize("policy", [api_pb2.LEADER, api_pb2.ALL], ids=["LEADER", "ALL"])
async def test_envelope_acks_arrive_on_the_ack_inbox(stub: Stub, nc: Any, stream_name: str, policy: int) -> None:
    await create_stream(stub, stream_name)
    await nc.publish(stream_name, b"plain first")
    ack_subject = f"{stream_name}.acks"
    async with inbox(nc, ack_subject) as acks:
        await nc.publish(stream_name, envelope(value=b"v", ackInbox=ack_subject, correlationId="c-1", ackPolicy=policy))
        ack = parse_ack(await bounded(acks.get()))

    assert (ack.offset, ack.correlationId, ack.ackPolicy, ack.ackInbox) == (1, "c-1", policy, ack_subject)
    assert (ack.stream, ack.partitionSubject, ack.msgSubject) == (stream_name, stream_name, stream_name)
    assert 0 < ack.receptionTimestamp <= ack.commitTimestamp
    stored = await receive(stub, stream_name, 2)
    assert (stored[1].offset, stored[1].correlationId, stored[1].ackInbox) == (1, "c-1", ack_subject)


async def test_many_envelopes_get_one_ack_each(stub: Stub, nc: Any, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    ack_subject = f"{stream_name}.acks"
    count = 200
    async with inbox(nc, ack_subject) as acks:
        for i in range(count):
            body = envelope(value=b"v%d" % i, ackInbox=ack_subject, correlationId=f"c{i}", ackPolicy=api_pb2.ALL)
            await nc.publish(stream_name, body)
        received = [parse_ack(await bounded(acks.get())) for _ in range(count)]

    by_id = {ack.correlationId: ack.offset for ack in received}
    assert len(by_id) == count and sorted(by_id.values()) == list(range(count))
    stored = await read_until_stop(stub, stream_name)
    assert {m.correlationId: m.offset for m in stored} == by_id


async def test_envelope_with_ack_policy_none_is_not_acked(stub: Stub, nc: Any, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    ack_subject = f"{stream_name}.acks"
    async with inbox(nc, ack_subject) as acks:
        await nc.publish(
            stream_name, envelope(value=b"quiet", ackInbox=ack_subject, correlationId="c", ackPolicy=api_pb2.NONE)
        )
        (message,) = await receive(stub, stream_name, 1)  # stored ...
        assert message.value == b"quiet"
        with pytest.raises(TimeoutError):  # ... and never acknowledged
            await asyncio.wait_for(acks.get(), NOTHING_WINDOW)


def _with_byte(index: int, value: int) -> Callable[[bytes], bytes]:
    return lambda body: body[:index] + bytes([value]) + body[index + 1 :]


def _flip_byte(index: int) -> Callable[[bytes], bytes]:
    return lambda body: body[:index] + bytes([body[index] ^ 0xFF]) + body[index + 1 :]


@pytest.mark.parametrize(
    "damage",
    [
        _flip_byte(8),  # the CRC no longer matches
        _with_byte(4, 1),  # unknown version
        _with_byte(7, 9),  # unknown message type
        _with_byte(5, 40),  # impossible header length
        lambda _: encode_envelope(MessageType.ACK, api_pb2.Ack(offset=3).SerializeToString()),  # not a publish
        lambda _: encode_envelope(MessageType.PUBLISH, b"\xff\xff\xff\xff"),  # not a protobuf Message
        lambda body: body[:10],  # truncated header
    ],
    ids=["bad-crc", "version", "type", "header-length", "ack-type", "bad-protobuf", "truncated"],
)
async def test_malformed_envelopes_are_stored_whole(
    stub: Stub, nc: Any, stream_name: str, damage: Callable[[bytes], bytes]
) -> None:
    await create_stream(stub, stream_name)
    ack_subject = f"{stream_name}.acks"
    good = envelope(value=b"v", ackInbox=ack_subject, correlationId="damaged", ackPolicy=api_pb2.LEADER)
    body = damage(good)
    sentinel = envelope(value=b"sentinel", ackInbox=ack_subject, correlationId="sentinel", ackPolicy=api_pb2.LEADER)
    async with inbox(nc, ack_subject) as acks:
        await nc.publish(stream_name, body)
        await nc.publish(stream_name, sentinel)
        first_ack = parse_ack(await bounded(acks.get()))
    assert (first_ack.correlationId, first_ack.offset) == ("sentinel", 1)  # the damaged one was not acked

    damaged, good_one = await receive(stub, stream_name, 2)
    assert (damaged.value, damaged.key, damaged.correlationId, damaged.ackInbox) == (body, b"", "", "")
    assert good_one.value == b"sentinel"


# ---------------------------------------------------------------------------------------------- refused envelopes


@pytest.mark.parametrize("policy", [300, -1, 3], ids=["300", "minus-1", "3"])
async def test_an_envelope_with_an_ack_policy_outside_the_enum_is_refused_alone(
    stub: Stub, nc: Any, stream_name: str, policy: int
) -> None:
    """The envelope is answered with an error ack and not stored; the plain messages of its read all are."""
    await create_stream(stub, stream_name)
    ack_subject = f"{stream_name}.acks"
    plain = [b"plain %d" % i for i in range(200)]
    async with inbox(nc, ack_subject) as acks:
        for payload in plain[:100]:
            await nc.publish(stream_name, payload)
        await nc.publish(
            stream_name, envelope(value=b"bad", ackInbox=ack_subject, correlationId="bad", ackPolicy=policy)
        )
        await nc.publish(stream_name, envelope(value=b"silent", ackPolicy=policy))  # no inbox: dropped, logged
        for payload in plain[100:]:
            await nc.publish(stream_name, payload)
        error_ack = parse_ack(await bounded(acks.get()))
    assert (error_ack.correlationId, error_ack.offset) == ("bad", -1)
    assert error_ack.ackError == api_pb2.Ack.UNKNOWN
    assert values(await receive(stub, stream_name, 200)) == plain
    assert values(await read_until_stop(stub, stream_name)) == plain


async def test_envelopes_with_bad_ack_inboxes_are_refused_alone(stub: Stub, nc: Any, stream_name: str) -> None:
    """Neither an inbox NATS refuses ('a b') nor one longer than the server's control line stops the other acks
    of the same append, or breaks the broker's NATS connection for later ones."""
    await create_stream(stub, stream_name)
    ack_subject = f"{stream_name}.acks"

    def good(i: int) -> bytes:
        return envelope(value=b"%d" % i, ackInbox=ack_subject, correlationId=f"c{i}", ackPolicy=api_pb2.LEADER)

    async with inbox(nc, ack_subject) as acks:
        for i in range(20):
            await nc.publish(stream_name, good(i))
        await nc.publish(stream_name, envelope(value=b"space", ackInbox="a b", correlationId="space"))
        await nc.publish(stream_name, envelope(value=b"long", ackInbox="_INBOX." + "x" * 5000, correlationId="long"))
        for i in range(20, 40):
            await nc.publish(stream_name, good(i))
        received = [parse_ack(await bounded(acks.get())) for _ in range(40)]
        assert sorted((a.offset, a.correlationId) for a in received) == [(i, f"c{i}") for i in range(40)]

        await nc.publish(stream_name, good(40))  # the broker still publishes acks
        assert parse_ack(await bounded(acks.get())).offset == 40
    assert values(await read_until_stop(stub, stream_name)) == [b"%d" % i for i in range(41)]


# ---------------------------------------------------------------------------------------------- subjects and groups


async def test_wildcard_subjects(stub: Stub, nc: Any, stream_name: str) -> None:
    star, tail = f"{stream_name}-star", f"{stream_name}-tail"
    await create_stream(stub, star, subject=f"{stream_name}.*")
    await create_stream(stub, tail, subject=f"{stream_name}.>")
    for subject in (stream_name, f"{stream_name}.a", f"{stream_name}.a.b", f"{stream_name}.b", f"{stream_name}.end"):
        await nc.publish(subject, subject.encode())

    # Each stream's last expected message is ".end": anything it should not have taken would come before it.
    star_got = await receive(stub, star, 3)
    assert [m.subject for m in star_got] == [f"{stream_name}.a", f"{stream_name}.b", f"{stream_name}.end"]
    assert values(star_got) == [m.subject.encode() for m in star_got]
    tail_got = await receive(stub, tail, 4)
    assert [m.subject for m in tail_got] == [
        f"{stream_name}.a",
        f"{stream_name}.a.b",
        f"{stream_name}.b",
        f"{stream_name}.end",
    ]
    assert offsets(await read_until_stop(stub, star)) == [0, 1, 2]
    assert offsets(await read_until_stop(stub, tail)) == [0, 1, 2, 3]


async def test_streams_on_one_subject_each_keep_a_copy(stub: Stub, nc: Any, stream_name: str) -> None:
    first, second = f"{stream_name}-1", f"{stream_name}-2"
    await create_stream(stub, first, subject=stream_name)
    await create_stream(stub, second, subject=stream_name)
    for i in range(10):
        await nc.publish(stream_name, b"m%d" % i)
    expected = [b"m%d" % i for i in range(10)]
    assert values(await receive(stub, first, 10)) == expected
    assert values(await receive(stub, second, 10)) == expected


async def test_queue_group_streams_share_the_messages(stub: Stub, nc: Any, broker: Broker, stream_name: str) -> None:
    assert broker.manager is not None
    grouped = [f"{stream_name}-g1", f"{stream_name}-g2"]
    for name in grouped:
        await create_stream(stub, name, subject=stream_name, group="workers")
    everything = f"{stream_name}-all"
    await create_stream(stub, everything, subject=stream_name)
    count = 200
    for i in range(count):
        await nc.publish(stream_name, b"m%d" % i)

    # The stream outside the group gets every message; the group's streams split them between them.
    assert len(await receive(stub, everything, count)) == count
    arrived: asyncio.Queue[bytes] = asyncio.Queue()

    async def follow(name: str) -> None:
        async with subscription(stub, name, startPosition=api_pb2.EARLIEST) as tail:
            while True:
                arrived.put_nowait((await tail.next()).value)

    readers = [asyncio.create_task(follow(name)) for name in grouped]
    try:
        got = [await bounded(arrived.get()) for _ in range(count)]
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    assert sorted(got) == sorted(b"m%d" % i for i in range(count))  # each exactly once
    shares = [broker.manager.leader_of(name, 0).high_watermark for name in grouped]
    assert sum(shares) == count
    assert all(share > 0 for share in shares)  # 2^-199 odds that NATS gave one member everything


# ---------------------------------------------------------------------------------------------- volume


async def test_many_messages_arrive_complete_in_order_and_batched(
    stub: Stub, nc: Any, broker: Broker, stream_name: str
) -> None:
    assert broker.manager is not None
    await create_stream(stub, stream_name)
    count = 20_000
    for i in range(count):
        await nc.publish(stream_name, b"message %06d" % i)
    await nc.flush()

    partition = broker.manager.leader_of(stream_name, 0)
    assert await partition.wait_for_data(count - 1, BOUND), f"only {partition.high_watermark} of {count} arrived"
    assert partition.high_watermark == count

    batches = 0
    stored: list[bytes] = []
    offset = 0
    while data := partition.read_committed(offset, 4 * 1024 * 1024):
        for position, header in iter_batches(data):
            batches += 1
            records = decode_records(data, position, header=header)
            assert [r.offset for r in records] == list(range(header.base_offset, header.next_offset))
            stored.extend(r.value or b"" for r in records)
            offset = header.next_offset
    assert stored == [b"message %06d" % i for i in range(count)]
    assert batches <= count // 20, f"{batches} batches for {count} messages"

    (last,) = await read_until_stop(stub, stream_name, startPosition=api_pb2.LATEST)
    assert (last.offset, last.value) == (count - 1, b"message %06d" % (count - 1))


async def test_small_segments_still_store_every_message(stub: Stub, nc: Any, broker: Broker, stream_name: str) -> None:
    """Ingest batches must fit what the stream's log accepts (here 4 KB segments), or whole batches are lost."""
    assert broker.manager is not None
    await create_stream(stub, stream_name, segmentMaxBytes=api_pb2.NullableInt64(value=4096))
    count = 1000
    for i in range(count):
        await nc.publish(stream_name, b"%04d" % i + b"x" * 96)
    await nc.flush()

    partition = broker.manager.leader_of(stream_name, 0)
    assert await partition.wait_for_data(count - 1, BOUND), f"only {partition.high_watermark} of {count} arrived"
    assert [m.value[:4] for m in await read_until_stop(stub, stream_name)] == [b"%04d" % i for i in range(count)]
    assert len(partition.log.segments) >= 100_000 // 4096
