"""``Nats-Msg-Id`` deduplication on NATS ingest, with a real nats-server.

Against the module's broker (default two-minute window): what plain NATS and Liftbridge envelope publishers see;
the window's end, its rebuild from the log and a broker restart are in ``test_ingest_dedupe``.

A message that must *not* be stored is always followed by one that must, from the same connection (NATS keeps a
connection's order): once the second is stored, the first was seen and left out, with no timed wait.
"""

from __future__ import annotations

from typing import Any

import pytest

from tidelog.protocol._gen import api_pb2

from .helpers import Stub, bounded, create_stream, envelope, inbox, parse_ack, read_until_stop, receive, values

pytestmark = pytest.mark.asyncio(loop_scope="module")

ID = "Nats-Msg-Id"


async def publish_id(nc: Any, subject: str, payload: bytes, msg_id: str | None, **fields: Any) -> None:
    await nc.publish(subject, payload, headers=None if msg_id is None else {ID: msg_id}, **fields)


# ---------------------------------------------------------------------------------------------- through the broker


async def test_a_duplicate_within_the_window_is_stored_once(stub: Stub, nc: Any, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    await publish_id(nc, stream_name, b"one", "a")
    await publish_id(nc, stream_name, b"one again", "a")
    await publish_id(nc, stream_name, b"one, JetStream-style", "a", reply=f"{stream_name}.reply")
    await publish_id(nc, stream_name, b"two", "b")
    await publish_id(nc, stream_name, b"two again", "b")
    await nc.publish(stream_name, b"plain")
    await nc.publish(stream_name, b"plain")  # no id: never a duplicate
    await publish_id(nc, stream_name, b"three", "c")

    got = await receive(stub, stream_name, 5)
    assert values(got) == [b"one", b"two", b"plain", b"plain", b"three"]
    assert got[0].headers[ID] == b"a"  # the id is kept as a record header (what a rebuild reads)
    assert values(await read_until_stop(stub, stream_name)) == values(got)  # nothing after them


async def test_empty_and_oversized_ids_are_no_id(stub: Stub, nc: Any, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    for msg_id in ("", " ", "x" * 2000):
        await publish_id(nc, stream_name, b"m", msg_id)
        await publish_id(nc, stream_name, b"m", msg_id)
    await publish_id(nc, stream_name, b"end", "end")
    assert values(await receive(stub, stream_name, 7)) == [b"m"] * 6 + [b"end"]


async def test_ids_are_per_stream(stub: Stub, nc: Any, stream_name: str) -> None:
    """Two streams on one subject each keep a copy, the id deduplicating within each."""
    other = f"{stream_name}-other"
    await create_stream(stub, stream_name)
    await create_stream(stub, other, subject=stream_name)
    for _ in range(3):
        await publish_id(nc, stream_name, b"same", "a")
    await publish_id(nc, stream_name, b"end", "end")
    assert values(await receive(stub, stream_name, 2)) == [b"same", b"end"]
    assert values(await receive(stub, other, 2)) == [b"same", b"end"]


async def test_ids_are_per_partition(stub: Stub, nc: Any, stream_name: str) -> None:
    await create_stream(stub, stream_name, partitions=2)
    for partition in (0, 1):
        subject = stream_name if partition == 0 else f"{stream_name}.1"
        for _ in range(2):
            await publish_id(nc, subject, b"same", "a")
        await publish_id(nc, subject, b"end", "end")
    for partition in (0, 1):
        assert values(await receive(stub, stream_name, 2, partition)) == [b"same", b"end"]


async def test_envelope_headers_deduplicate_and_a_duplicate_gets_the_original_ack(
    stub: Stub, nc: Any, stream_name: str
) -> None:
    await create_stream(stub, stream_name)
    acks_subject = f"{stream_name}.acks"
    async with inbox(nc, acks_subject) as acks:
        for correlation in ("first", "retry"):
            body = envelope(
                value=b"v", headers={ID: b"e1"}, ackInbox=acks_subject, correlationId=correlation, ackPolicy=api_pb2.ALL
            )
            await nc.publish(stream_name, body)
            ack = parse_ack(await bounded(acks.get()))  # one at a time: the original is stored before its retry
            assert (ack.correlationId, ack.offset) == (correlation, 0)
    await nc.publish(stream_name, envelope(value=b"w", headers={ID: b"e2"}))
    assert values(await receive(stub, stream_name, 2)) == [b"v", b"w"]
