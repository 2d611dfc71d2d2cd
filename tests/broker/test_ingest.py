"""NatsIngest batching against a real partition log, with the NATS client replaced by one that delivers on demand.

A real NATS server decides by itself how many messages pile up between two turns of the ingest loop; these
tests pile them up deliberately (the callback never yields, so everything delivered is pending when the loop
runs), which is what a slow disk does under load.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tidelog.api._gen import api_pb2
from tidelog.api.envelope import MessageType, encode_envelope
from tidelog.broker.ingest import NatsIngest
from tidelog.broker.partition import Partition
from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.protocol.records import decode_records, iter_batches
from tidelog.storage.config import LogConfig
from tidelog.storage.log import Log

from .helpers import BOUND

MiB = 1024 * 1024


@dataclass
class Delivered:
    subject: str
    reply: str
    data: bytes
    headers: dict[str, str] | None = None


class FakeSubscription:
    async def unsubscribe(self) -> None:
        pass


@dataclass
class FakeNats:
    """Records the subscription callback, so the test delivers messages when it chooses."""

    callback: Callable[[Any], Any] | None = None
    published: list[tuple[str, bytes]] = field(default_factory=list)

    async def subscribe(self, subject: str, *, cb: Callable[[Any], Any], **_: Any) -> FakeSubscription:
        self.callback = cb
        return FakeSubscription()

    async def publish(self, subject: str, data: bytes) -> None:
        self.published.append((subject, data))

    async def flush(self) -> None:
        pass

    async def deliver(self, message: Delivered) -> None:
        assert self.callback is not None
        await self.callback(message)


async def open_partition(path: Path, config: LogConfig) -> Partition:
    stream = StreamRecord("s", "s", "", 1, 1, 1)
    record = PartitionRecord("s", 0, ("b1",), "b1", ("b1",))
    return Partition(stream, record, await Log.open_async(path, config), "b1", min_isr=1)


@pytest.fixture
async def fake_nats() -> AsyncIterator[FakeNats]:
    yield FakeNats()


def stored_batches(partition: Partition) -> list[list[bytes]]:
    """Every committed batch, as the list of its record values."""
    batches: list[list[bytes]] = []
    offset = 0
    while data := partition.read_committed(offset, 64 * MiB):
        for position, header in iter_batches(data):
            batches.append([r.value or b"" for r in decode_records(data, position, header=header)])
            offset = header.next_offset
    return batches


@pytest.mark.parametrize(
    ("config", "size", "count"),
    [
        (LogConfig(), 2000, 3000),  # ~6 MB waiting: more than one 4 MiB batch
        (LogConfig(segment_max_bytes=4096), 100, 500),  # small segments: batches of at most 4 KB
    ],
    ids=["above-max-batch-bytes", "small-segments"],
)
async def test_a_backlog_is_split_into_batches_the_log_accepts(
    tmp_path: Path, fake_nats: FakeNats, config: LogConfig, size: int, count: int
) -> None:
    partition = await open_partition(tmp_path / "p", config)
    ingest = NatsIngest(fake_nats, partition)
    await ingest.start()
    try:
        sent = [b"%06d" % i + b"x" * (size - 6) for i in range(count)]
        for data in sent:
            await fake_nats.deliver(Delivered("s", "", data))

        assert await partition.wait_for_data(count - 1, BOUND), f"{partition.high_watermark} of {count} stored"
        batches = stored_batches(partition)
        assert [value for batch in batches for value in batch] == sent
        assert len(batches) < count  # batched, not one append per message
        assert (ingest.appended, ingest.failed) == (count, 0)
    finally:
        await ingest.stop()
        await partition.close()


async def test_stop_stores_what_was_already_received(tmp_path: Path, fake_nats: FakeNats) -> None:
    partition = await open_partition(tmp_path / "p", LogConfig())
    ingest = NatsIngest(fake_nats, partition)
    await ingest.start()
    for i in range(10):
        await fake_nats.deliver(Delivered("s", "", b"m%d" % i))
    await ingest.stop()  # before the ingest loop had a turn

    assert partition.high_watermark == 10
    assert [v for batch in stored_batches(partition) for v in batch] == [b"m%d" % i for i in range(10)]
    await partition.close()


@dataclass
class FlakyNats(FakeNats):
    """A client whose publish to one subject fails (as any publish does while the connection is down)."""

    failing: str = ""

    async def publish(self, subject: str, data: bytes) -> None:
        if subject == self.failing:
            raise ConnectionError("injected: the connection is down")
        await super().publish(subject, data)


async def test_an_ack_that_cannot_be_sent_does_not_stop_the_others(tmp_path: Path) -> None:
    nc = FlakyNats(failing="acks.broken")
    partition = await open_partition(tmp_path / "p", LogConfig())
    ingest = NatsIngest(nc, partition)
    await ingest.start()
    inboxes = [f"acks.{i}" for i in range(20)] + ["acks.broken"] + [f"acks.{i}" for i in range(20, 40)]
    try:
        for i, inbox in enumerate(inboxes):
            body = api_pb2.Message(value=b"%d" % i, ackInbox=inbox, correlationId=f"c{i}").SerializeToString()
            await nc.deliver(Delivered("s", "", encode_envelope(MessageType.PUBLISH, body)))
        await ingest.stop()  # waits for the appends and their acks
        assert partition.high_watermark == len(inboxes)
        assert sorted(subject for subject, _ in nc.published) == sorted(i for i in inboxes if i != "acks.broken")
        assert ingest.ack_failures == 1
    finally:
        await partition.close()
