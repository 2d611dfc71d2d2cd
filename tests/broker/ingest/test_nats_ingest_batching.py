"""NatsIngest batching against a real partition log, with the NATS client replaced by one that delivers on demand.

A real NATS server decides by itself how many messages pile up between two turns of the ingest loop; these
tests pile them up deliberately (the callback never yields, so everything delivered is pending when the loop
runs), which is what a slow disk does under load.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.broker.helpers import open_partition, stored_batches
from tests.helpers import BOUND
from tidelog.broker.ingest.nats_ingest import NatsIngest
from tidelog.protocol._gen import api_pb2
from tidelog.protocol.envelope import MessageType, encode_envelope
from tidelog.storage.config import LogConfig
from tidelog.testing.fakes import Delivered, FakeNats


@pytest.fixture
async def fake_nats() -> AsyncIterator[FakeNats]:
    yield FakeNats()


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
