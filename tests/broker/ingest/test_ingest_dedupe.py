"""``Nats-Msg-Id`` deduplication of :class:`NatsIngest` on a bare partition, a real nats-server and a manual clock.

The window's end (the clock moves, nothing sleeps) and restarts that rebuild the window from the log. A message
that must *not* be stored is always followed by one that must, from the same connection (NATS keeps a
connection's order): once the second is stored, the first was seen and left out, with no timed wait.

Also a whole broker restarted on its data (one test with a damaged batch in the window it rebuilds), and a broker
whose ingest fails to start. It is here rather than beside the module-scoped broker of
``test_nats_dedupe``: spawning nats-server and etcd while that broker's gRPC threads run crashed the forked child
(status -11, "Other threads are currently calling into gRPC, skipping fork() handlers") in most runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import nats
import pytest
import pytest_asyncio

from tests.broker.conftest import broker_config
from tests.broker.helpers import (
    create_stream,
    garble_first_record,
    open_partition,
    read_until_stop,
    receive,
    stored_batches,
    values,
)
from tests.helpers import BOUND
from tidelog.broker.embedded import EmbeddedNats
from tidelog.broker.ingest.nats_ingest import NatsIngest
from tidelog.broker.partitions.partition import Partition
from tidelog.clock import ManualClock
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.protocol._gen import api_pb2_grpc
from tidelog.protocol.records import decode_records, iter_batches
from tidelog.server import Broker
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


async def send(url: str, messages: list[tuple[bytes, str | None]]) -> None:
    client = await nats.connect(url, connect_timeout=BOUND, allow_reconnect=False)
    try:
        for payload, msg_id in messages:
            await client.publish("s", payload, headers=None if msg_id is None else {"Nats-Msg-Id": msg_id})
        await client.flush()
    finally:
        await client.close()


async def stored(partition: Partition, count: int) -> list[bytes]:
    assert await partition.wait_for_data(count - 1, BOUND), f"{partition.high_watermark} of {count} stored"
    return [value for batch in stored_batches(partition) for value in batch]


async def test_after_the_window_an_id_is_stored_again(tmp_path: Path, server: EmbeddedNats) -> None:
    clock = ManualClock()
    partition = await open_partition(tmp_path / "p", LogConfig())
    ingest = NatsIngest(FakeNats(), partition, urls=[server.url], clock=clock, duplicate_window_ms=1000)
    await ingest.start()
    try:
        await send(server.url, [(b"1", "a"), (b"1 dup", "a"), (b"2", "b")])
        assert await stored(partition, 2) == [b"1", b"2"]
        clock.advance(0.5)
        await send(server.url, [(b"1 dup", "a"), (b"3", "c")])
        assert await stored(partition, 3) == [b"1", b"2", b"3"]
        clock.advance(0.6)  # "a" arrived 1.1 s ago: out of the window
        await send(server.url, [(b"1 later", "a"), (b"1 later dup", "a"), (b"4", "d")])
        assert await stored(partition, 5) == [b"1", b"2", b"3", b"1 later", b"4"]
        assert ingest.duplicates == 3
    finally:
        await ingest.stop()
        await partition.close()


async def test_window_zero_disables_deduplication(tmp_path: Path, server: EmbeddedNats) -> None:
    partition = await open_partition(tmp_path / "p", LogConfig())
    ingest = NatsIngest(FakeNats(), partition, urls=[server.url], duplicate_window_ms=0)
    await ingest.start()
    try:
        await send(server.url, [(b"1", "a"), (b"1", "a")])
        assert await stored(partition, 2) == [b"1", b"1"]
        assert ingest.window is None
    finally:
        await ingest.stop()
        await partition.close()


async def test_a_restarted_ingest_rebuilds_the_window_from_the_log(tmp_path: Path, server: EmbeddedNats) -> None:
    clock = ManualClock()
    path = tmp_path / "p"
    partition = await open_partition(path, LogConfig())
    ingest = NatsIngest(FakeNats(), partition, urls=[server.url], clock=clock, duplicate_window_ms=1000)
    await ingest.start()
    await send(server.url, [(b"1", "a"), (b"plain", None), (b"2", "b")])
    assert await stored(partition, 3) == [b"1", b"plain", b"2"]
    await ingest.stop()
    await partition.close()

    clock.advance(0.5)
    partition = await open_partition(path, LogConfig())
    ingest = NatsIngest(FakeNats(), partition, urls=[server.url], clock=clock, duplicate_window_ms=1000)
    await ingest.start()
    try:
        assert ingest.window is not None and len(ingest.window) == 2
        await send(server.url, [(b"1 dup", "a"), (b"2 dup", "b"), (b"3", "c")])
        assert await stored(partition, 4) == [b"1", b"plain", b"2", b"3"]
    finally:
        await ingest.stop()
        await partition.close()

    clock.advance(0.6)  # "a" and "b" are out of the window now; "c" is not
    partition = await open_partition(path, LogConfig())
    ingest = NatsIngest(FakeNats(), partition, urls=[server.url], clock=clock, duplicate_window_ms=1000)
    await ingest.start()
    try:
        await send(server.url, [(b"1 again", "a"), (b"3 dup", "c"), (b"4", "d")])
        assert await stored(partition, 6) == [b"1", b"plain", b"2", b"3", b"1 again", b"4"]
    finally:
        await ingest.stop()
        await partition.close()


# ---------------------------------------------------------------------------------------------- a broker restart


async def test_a_restarted_broker_still_deduplicates(tmp_path: Path) -> None:
    data_dir = tmp_path / "restart"
    first = Broker(broker_config(data_dir))
    await first.start()
    try:
        await publish_and_read(first, [(b"1", "a"), (b"1 dup", "a"), (b"2", "b")], [b"1", b"2"], create=True)
    finally:
        await first.stop()

    second = Broker(broker_config(data_dir))
    await second.start()
    try:
        await publish_and_read(second, [(b"3", "c")], [b"1", b"2", b"3"])
        await publish_and_read(second, [(b"1 dup", "a"), (b"2 dup", "b"), (b"4", "d")], [b"1", b"2", b"3", b"4"])
    finally:
        await second.stop()


async def publish_and_read(
    broker: Broker, messages: list[tuple[bytes, str | None]], expected: list[bytes], *, create: bool = False
) -> None:
    """Once ``broker`` leads the stream, publish ``messages`` and check the stream then holds ``expected``."""
    assert broker.grpc is not None and broker.mirror is not None
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{broker.grpc.port}")
    client = await nats.connect(broker.nats_urls, connect_timeout=BOUND, allow_reconnect=False)
    try:
        stub = api_pb2_grpc.APIStub(channel)
        if create:
            await create_stream(stub, "kept")

        def leads(snapshot: MetadataSnapshot) -> bool:  # its listeners, the manager's among them, have acted
            record = snapshot.partition("kept", 0)
            return record is not None and record.leader == broker.id

        await broker.mirror.wait_for(leads, BOUND)
        for payload, msg_id in messages:
            await client.publish("kept", payload, headers=None if msg_id is None else {"Nats-Msg-Id": msg_id})
        await client.flush()
        assert values(await receive(stub, "kept", len(expected))) == expected
        assert values(await read_until_stop(stub, "kept")) == expected
    finally:
        await client.close()
        await channel.close()


# ---------------------------------------------------------------------------------------------- ingest failing to start


async def test_a_restarted_broker_ingests_past_an_unreadable_batch_in_the_window(tmp_path: Path) -> None:
    """A batch of the duplicate window whose records do not decode costs the window its ids, not the ingest."""
    data_dir = tmp_path / "damaged"
    first = Broker(broker_config(data_dir))
    await first.start()
    try:
        async with connected(first) as (stub, client):
            await create_stream(stub, "damaged")
            await leads(first, "damaged")
            for i in range(5):
                await client.publish("damaged", b"old %d" % i, headers={"Nats-Msg-Id": f"old-{i}"})
            await client.flush()
            partition = first.manager.local("damaged", 0) if first.manager else None
            assert partition is not None and await partition.wait_for_data(4, BOUND)
    finally:
        await first.stop()
    (path, position, _, size), *_ = segment_batches_under(data_dir / "streams", "damaged")
    garble_first_record(path, position, size, fix_crc=True)

    second = Broker(broker_config(data_dir))
    await second.start()
    try:
        async with connected(second) as (_, client):
            await leads(second, "damaged")
            for i in range(10):
                await client.publish("damaged", b"new %d" % i, headers={"Nats-Msg-Id": f"new-{i}"})
            await client.flush()
            assert second.manager is not None
            partition = second.manager.local("damaged", 0)
            assert partition is not None
            assert await partition.wait_for_data(14, BOUND), f"{partition.log_end - 5} of 10 NATS messages stored"
            assert values_from(partition, 5) == [b"new %d" % i for i in range(10)]
    finally:
        await second.stop()


async def test_an_ingest_that_fails_to_start_is_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader whose ingest fails to start says so and keeps trying: it does not lead on without ingest."""
    real_start = NatsIngest.start
    failures = [RuntimeError("injected: the first start fails")]
    started = asyncio.Event()

    async def start(self: NatsIngest) -> None:
        if failures:
            raise failures.pop()
        await real_start(self)
        started.set()

    monkeypatch.setattr(NatsIngest, "start", start)
    broker = Broker(broker_config(tmp_path / "retry"))
    await broker.start()
    try:
        async with connected(broker) as (stub, client):
            await create_stream(stub, "retried")
            assert broker.manager is not None
            assert not failures  # the first start failed
            await asyncio.wait_for(started.wait(), BOUND)  # a retry succeeded
            assert broker.manager.ingesting("retried", 0)
            for i in range(10):
                await client.publish("retried", b"%d" % i)
            await client.flush()
            assert values(await receive(stub, "retried", 10)) == [b"%d" % i for i in range(10)]
    finally:
        await broker.stop()


@contextlib.asynccontextmanager
async def connected(broker: Broker) -> AsyncIterator[tuple[api_pb2_grpc.APIStub, Any]]:
    """A gRPC stub and a NATS client for ``broker``."""
    assert broker.grpc is not None
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{broker.grpc.port}")
    client = await nats.connect(broker.nats_urls, connect_timeout=BOUND, allow_reconnect=False)
    try:
        yield api_pb2_grpc.APIStub(channel), client
    finally:
        await client.close()
        await channel.close()


async def leads(broker: Broker, stream: str) -> None:
    """Return once ``broker`` leads ``stream``'s partition 0 and its manager has acted on it."""
    assert broker.mirror is not None

    def done(snapshot: MetadataSnapshot) -> bool:
        record = snapshot.partition(stream, 0)
        return record is not None and record.leader == broker.id

    await broker.mirror.wait_for(done, BOUND)


def segment_batches_under(root: Path, stream: str) -> list[tuple[Path, int, int, int]]:
    """(segment file, position, base offset, size) of every batch of ``stream``'s one partition under ``root``
    (a broker's ``streams`` directory also holds the internal ``__cursors`` stream)."""
    (directory,) = {path.parent for path in root.glob(f"{stream}@*/*/*.log")}
    found = []
    for path in sorted(directory.glob("*.log")):
        for position, header in iter_batches(path.read_bytes(), verify=False):
            found.append((path, position, header.base_offset, header.size))
    return found


def values_from(partition: Partition, offset: int) -> list[bytes]:
    """The values of the committed records from ``offset`` on."""
    found: list[bytes] = []
    while data := partition.read_committed(offset, 64 * 1024 * 1024):
        for position, header in iter_batches(data):
            found += [r.value or b"" for r in decode_records(data, position, header=header)]
            offset = header.next_offset
    return found
