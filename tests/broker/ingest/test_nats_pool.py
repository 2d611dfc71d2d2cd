"""The broker's shared ingest connections: how many there are, and a hot partition beside a quiet one on one of them.

A real nats-server (its ``/connz`` monitoring endpoint counts the connections) and real partition logs; the hot
partition's appends are held at a gate, so "still backlogged" is a state the test controls, not a race.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import pytest
import pytest_asyncio

from tests.broker.helpers import stored_batches, until
from tests.helpers import BOUND
from tidelog.broker.embedded import EmbeddedNats
from tidelog.broker.ingest.nats_ingest import NatsIngest
from tidelog.broker.ingest.nats_pool import IngestPool
from tidelog.broker.ingest.natsproto import Item
from tidelog.broker.partitions.partition import Partition
from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.storage.config import LogConfig
from tidelog.storage.log import Log
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


def ingest_connections(server: EmbeddedNats) -> int:
    """The server's client connections named by the ingest pool (``/connz``)."""
    with urllib.request.urlopen(f"{server.monitor_url}/connz?limit=1000", timeout=BOUND) as answer:
        connz = json.load(answer)
    return sum(1 for conn in connz["connections"] if str(conn.get("name", "")).startswith("tidelog-ingest"))


async def open_stream_partition(path: Path, name: str) -> Partition:
    stream = StreamRecord(name, name, "", 1, 1, 1)
    record = PartitionRecord(name, 0, ("b1",), "b1", ("b1",))
    return Partition(stream, record, await Log.open_async(path, LogConfig()), "b1", min_isr=1)


async def publish(url: str, subject: str, payloads: list[bytes]) -> None:
    nc = await nats.connect(url, connect_timeout=BOUND, allow_reconnect=False, pending_size=32 * 1024 * 1024)
    try:
        for payload in payloads:
            await nc.publish(subject, payload)
        await nc.flush()
        await nc.flush()  # see helpers.subscribed: the second one follows every publish
    finally:
        await nc.close()


async def test_fifty_partitions_share_the_configured_connections(server: EmbeddedNats) -> None:
    pool = IngestPool([server.url], size=3)
    inboxes: list[list[Item]] = [[] for _ in range(50)]

    def collect(inbox: list[Item]) -> Callable[[list[Item], int], None]:
        return lambda items, _received: inbox.extend(items)

    try:
        # Fifty new leaders at once: one SUB each on the pool's connections, no connection of their own.
        subs = await asyncio.gather(*(pool.subscribe(f"fifty.{i}", collect(inbox)) for i, inbox in enumerate(inboxes)))
        assert len(pool.readers) == 3 and sorted(r.load for r in pool.readers) == [16, 17, 17]
        assert await asyncio.to_thread(ingest_connections, server) == 3
        nc = await nats.connect(server.url, connect_timeout=BOUND)
        try:
            for i in range(50):
                await nc.publish(f"fifty.{i}", b"to %d" % i)
            await nc.flush()
        finally:
            await nc.close()
        await until(lambda: all(inboxes), "every partition's message")
        assert [[bytes(item) for item in inbox] for inbox in inboxes] == [[b"to %d" % i] for i in range(50)]  # type: ignore[arg-type]
        for reader, sub in subs[:10]:
            await reader.unsubscribe(sub)
        assert sum(r.load for r in pool.readers) == 40
    finally:
        await pool.close()


class Gate:
    """Holds a partition's writes until opened: its ingest backs up while the test looks."""

    def __init__(self, partition: Partition) -> None:
        self.opened = asyncio.Event()
        write: Callable[..., Awaitable[Any]] = partition.write

        async def held(*args: Any, **kwargs: Any) -> Any:
            await self.opened.wait()
            return await write(*args, **kwargs)

        partition.write = held  # type: ignore[method-assign]


async def test_a_hot_partition_does_not_starve_a_quiet_one(tmp_path: Path, server: EmbeddedNats) -> None:
    """Both on one connection: the hot one, its appends held, passes its bound and is paused alone (an UNSUB);
    every message of the quiet one is stored meanwhile. Opened, the hot one stores what it had received, in order,
    and is subscribed again."""
    pool = IngestPool([server.url], size=1)
    hot_partition = await open_stream_partition(tmp_path / "hot", "hot")
    calm_partition = await open_stream_partition(tmp_path / "calm", "calm")
    gate = Gate(hot_partition)
    hot = NatsIngest(FakeNats(), hot_partition, pool=pool, max_pending_bytes=64 * 1024, max_inflight=1)
    calm = NatsIngest(FakeNats(), calm_partition, pool=pool)
    await hot.start()
    await calm.start()
    try:
        assert len(pool.readers) == 1 and hot.reader is calm.reader
        flood = [b"%06d" % i + b"h" * 1000 for i in range(2000)]  # 2 MB against a bound of 64 KiB
        trickle = [b"calm %d" % i for i in range(50)]
        await publish(server.url, "hot", flood)
        await publish(server.url, "calm", trickle)
        assert await calm_partition.wait_for_data(len(trickle) - 1, BOUND)
        assert [v for batch in stored_batches(calm_partition) for v in batch] == trickle
        assert hot.subscription is not None and hot.subscription.paused and hot.pauses == 1
        assert hot.appended == 0 and hot_partition.log_end == 0  # still backlogged
        gate.opened.set()
        await until(lambda: hot.subscription is not None and not hot.subscription.paused, "the hot one resumed")
        stored = [v for batch in stored_batches(hot_partition) for v in batch]
        # What reached us before the UNSUB took effect, in order (the server may have routed all of it by then).
        assert stored and stored == flood[: len(stored)]
        assert hot.reader is not None
        await hot.reader.confirm()  # the SUB again has taken effect
        await publish(server.url, "hot", [b"after"])
        assert await hot_partition.wait_for_data(len(stored), BOUND)
        assert [v for batch in stored_batches(hot_partition) for v in batch][-1] == b"after"
    finally:
        gate.opened.set()
        await hot.stop()
        await calm.stop()
        await pool.close()
        await hot_partition.close()
        await calm_partition.close()


async def test_a_partition_alone_on_its_connection_pauses_the_socket(tmp_path: Path, server: EmbeddedNats) -> None:
    """Alone, the hot partition's pause stops reading the socket (NATS buffers for it, nothing is lost); a second
    partition joining the connection turns that pause into an UNSUB, so the newcomer is not held up."""
    pool = IngestPool([server.url], size=1)
    hot_partition = await open_stream_partition(tmp_path / "hot", "alone")
    calm_partition = await open_stream_partition(tmp_path / "calm", "joiner")
    gate = Gate(hot_partition)
    hot = NatsIngest(FakeNats(), hot_partition, pool=pool, max_pending_bytes=64 * 1024, max_inflight=1)
    calm = NatsIngest(FakeNats(), calm_partition, pool=pool)
    await hot.start()
    try:
        flood = [b"%06d" % i + b"a" * 1000 for i in range(300)]  # 300 KB: more than the bound, within NATS's
        await publish(server.url, "alone", flood)
        assert hot.subscription is not None and hot.reader is not None
        await until(lambda: hot.subscription is not None and hot.subscription.paused, "the hot one paused")
        assert not hot.subscription.away and hot.reader.socket_paused
        await calm.start()  # shares the connection now: the hot one is unsubscribed instead
        assert hot.subscription.away and not hot.reader.socket_paused
        await publish(server.url, "joiner", [b"hello"])
        assert await calm_partition.wait_for_data(0, BOUND)
    finally:
        gate.opened.set()
        await hot.stop()
        await calm.stop()
        await pool.close()
        await hot_partition.close()
        await calm_partition.close()
