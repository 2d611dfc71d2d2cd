"""``Nats-Msg-Id`` deduplication of :class:`NatsIngest` on a bare partition, a real nats-server and a manual clock.

The window's end (the clock moves, nothing sleeps) and restarts that rebuild the window from the log. A message
that must *not* be stored is always followed by one that must, from the same connection (NATS keeps a
connection's order): once the second is stored, the first was seen and left out, with no timed wait.

Also a whole broker restarted on its data. It is here rather than beside the module-scoped broker of
``test_nats_dedupe``: spawning nats-server and etcd while that broker's gRPC threads run crashed the forked child
(status -11, "Other threads are currently calling into gRPC, skipping fork() handlers") in most runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import nats
import pytest
import pytest_asyncio

from tidelog.api._gen import api_pb2_grpc
from tidelog.broker.embedded import EmbeddedNats
from tidelog.broker.ingest import NatsIngest
from tidelog.broker.partition import Partition
from tidelog.broker.server import Broker
from tidelog.clock import ManualClock
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.storage.config import LogConfig

from .conftest import broker_config
from .helpers import BOUND, create_stream, read_until_stop, values
from .test_ingest import FakeNats, open_partition, stored_batches
from .test_nats_ingest import receive

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
