"""NatsIngest on its own NATS connection: a real nats-server and a real partition log, no broker around them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
import pytest_asyncio

from tests.broker.helpers import open_partition, stored_batches
from tests.helpers import BOUND
from tidelog.broker.embedded import EmbeddedNats
from tidelog.broker.ingest.nats_ingest import NatsIngest
from tidelog.storage.config import LogConfig
from tidelog.testing.fakes import FakeNats

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EmbeddedNats]:
    started = EmbeddedNats(tmp_path_factory.mktemp("nats"))
    await started.start()
    try:
        yield started
    finally:
        await started.stop()


async def publish(url: str, subject: str, payloads: list[bytes], **fields: Any) -> None:
    nc = await nats.connect(url, connect_timeout=BOUND, allow_reconnect=False, pending_size=32 * 1024 * 1024)
    try:
        for payload in payloads:
            await nc.publish(subject, payload, **fields)
        await nc.flush()
        await nc.flush()  # see helpers.subscribed: the second one follows every publish
    finally:
        await nc.close()


async def test_reads_pause_while_appends_lag_and_nothing_is_lost(tmp_path: Path, server: EmbeddedNats) -> None:
    """With a bound of one byte every read pauses the socket until its append is done: many pause/resume cycles.
    (The partition is alone on its connection: it pauses the socket, and NATS buffers for it.)"""
    partition = await open_partition(tmp_path / "p", LogConfig(segment_max_bytes=64 * 1024))
    ingest = NatsIngest(FakeNats(), partition, urls=[server.url], max_pending_bytes=1, max_inflight=1)
    await ingest.start()
    assert ingest.reader is not None
    count = 20_000
    sent = [b"%06d" % i + b"x" * 200 for i in range(count)]
    try:
        await publish(server.url, "s", sent)
        assert await partition.wait_for_data(count - 1, BOUND), f"{partition.high_watermark} of {count} stored"
        assert [value for batch in stored_batches(partition) for value in batch] == sent
        assert (ingest.appended, ingest.failed) == (count, 0)
        assert ingest.subscription is not None
        assert ingest.pauses > 0 and not ingest.subscription.paused
    finally:
        await ingest.stop()
        await partition.close()


async def test_stop_stores_everything_the_server_sent(tmp_path: Path, server: EmbeddedNats) -> None:
    partition = await open_partition(tmp_path / "p", LogConfig())
    ingest = NatsIngest(FakeNats(), partition, urls=[server.url])
    await ingest.start()
    count = 5000
    await publish(server.url, "s", [b"m%d" % i for i in range(count)], reply="r")  # the general path
    await ingest.stop()  # UNSUB, drain up to its PONG, append
    assert partition.high_watermark == count
    assert [v for batch in stored_batches(partition) for v in batch] == [b"m%d" % i for i in range(count)]
    await partition.close()


async def test_urls_the_reader_does_not_speak_go_through_nats_py(tmp_path: Path) -> None:
    partition = await open_partition(tmp_path / "p", LogConfig())
    fake = FakeNats()
    ingest = NatsIngest(fake, partition, urls=["tls://127.0.0.1:1"])
    await ingest.start()
    try:
        assert ingest.reader is None and fake.callback is not None
    finally:
        await ingest.stop()
        await partition.close()
