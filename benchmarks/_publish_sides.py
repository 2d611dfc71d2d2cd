"""The two sides ``benchmarks.publish`` measures, and what they share: tidelog (``tidelog serve`` as a child
process with the native client) and NATS JetStream (``nats-server -js`` with nats-py), each behind one
:class:`Side` protocol so every metric runs the same code against both. ``benchmarks.groups`` and
``benchmarks.append`` start their tidelog broker with :class:`TidelogServer` too."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import nats
from nats.js.api import StorageType, StreamConfig

from benchmarks._common import log
from benchmarks._jetstream import JS_PUBLISH_WINDOW, JetStreamServer, publish_all, publish_one_at_a_time, pull_all
from benchmarks._tls import client_ssl
from tidelog.client import Acks, Admin, Cluster, Codec, Consumer, Producer
from tidelog.launch.ports import free_ports
from tidelog.launch.probes import all_of, tcp_probe
from tidelog.launch.process import ManagedProcess
from tidelog.local.certificates import DevCertificates

_LOOPBACK = "127.0.0.1"
INGEST_FLUSH_EVERY = 500  # plain publisher: flush (PING/PONG) this often, so it never outruns the server's limits
POLL_INTERVAL = 0.005  # seconds between committed-count polls


def make_payloads(size: int, count: int) -> list[bytes]:
    """``count`` distinct random values of ``size`` bytes: incompressible, also across the records of a batch
    (one value repeated would hand a compressing codec a free ride). Both sides send the same list."""
    pool = os.urandom(size * count)
    return [pool[i : i + size] for i in range(0, size * count, size)]


def deadline_for(count: int, floor: float = 60.0) -> float:
    """A generous bound for moving ``count`` messages: 200 msg/s at worst, never under ``floor`` seconds."""
    return max(floor, count / 200)


async def poll_until(read: Callable[[], Awaitable[int]], target: int, timeout: float, what: str) -> None:
    """Poll ``read()`` until it reaches ``target``; bounded by ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await read()
        if value >= target:
            return
        if loop.time() >= deadline:
            raise TimeoutError(f"{what}: {value} of {target} after {timeout:g}s")
        await asyncio.sleep(POLL_INTERVAL)


async def produce_all(producer: Producer, stream: str, payloads: Sequence[bytes]) -> float:
    """msg/s: every payload sent through ``producer`` (started and closed here) into the new, empty ``stream``,
    each acknowledged; raises if one was refused or the offsets are not 0..n-1."""
    count = len(payloads)
    await producer.start()
    try:
        send = producer.send
        start = time.perf_counter()
        futures = [await send(stream, payload) for payload in payloads]
        await asyncio.wait_for(producer.flush(), deadline_for(count))
        elapsed = time.perf_counter() - start
    finally:
        await producer.close()
    offsets = [future.result().offset for future in futures]  # raises if any record was refused
    if offsets[-1] != count - 1:
        raise RuntimeError(f"tidelog {stream}: last offset {offsets[-1]}, expected {count - 1}")
    return count / elapsed


class PlainPublisher:
    """Core NATS publishes (no acks) on one subject, with a ``flush()`` every ``flush_every`` messages: the
    same code feeds both sides' NATS ingest."""

    def __init__(self, nc: Any, flush_every: int = INGEST_FLUSH_EVERY) -> None:
        self._nc = nc
        self._flush_every = flush_every

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, url: str) -> AsyncIterator[PlainPublisher]:
        nc = await nats.connect(url, name="bench-plain-publisher", pending_size=32 * 1024 * 1024)
        try:
            yield cls(nc)
        finally:
            await nc.close()

    async def publish(self, subject: str, payloads: Sequence[bytes]) -> None:
        nc, every = self._nc, self._flush_every
        for i, payload in enumerate(payloads, 1):
            await nc.publish(subject, payload)
            if i % every == 0:
                await nc.flush(timeout=30)
        await nc.flush(timeout=30)


async def measure_ingest(
    url: str, subject: str, payloads: Sequence[bytes], committed: Callable[[], Awaitable[int]]
) -> float:
    """msg/s from the first plain publish to all ``payloads`` committed. One warm-up message first proves the
    subscription is in place (a message published before it would be lost, and the wait would never end)."""
    count = len(payloads)
    async with PlainPublisher.connect(url) as publisher:
        await publisher.publish(subject, payloads[:1])
        await poll_until(committed, 1, 30, f"ingest warm-up on {subject}")
        start = time.perf_counter()
        await publisher.publish(subject, payloads)
        await poll_until(committed, count + 1, deadline_for(count), f"ingest on {subject}")
        return count / (time.perf_counter() - start)


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100)."""
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


class Side(Protocol):
    """One server in one durability mode, with the measurements the benchmark makes on it."""

    name: str
    batch_reads: bool  # can count messages read without decoding them (consume(decode=False))
    idempotence: bool  # can also measure latency with an idempotent producer (latencies(idempotent=True))
    encryption: bool  # can create encrypted streams (produce(encrypted=True))

    async def produce(self, stream: str, payloads: Sequence[bytes], *, encrypted: bool = False) -> float:
        """msg/s: every payload sent to a new stream (encrypted at rest when asked) and acknowledged."""
        ...

    async def consume(self, stream: str, count: int, size: int, *, decode: bool = True) -> float:
        """msg/s: all ``count`` messages of ``stream`` (``size`` bytes each) read back; ``decode=False`` only where
        ``batch_reads`` says the side can count messages without decoding them."""
        ...

    async def latencies(
        self, stream: str, payloads: Sequence[bytes], warmup: int, *, idempotent: bool = False
    ) -> list[float]:
        """µs per publish, one at a time (the first ``warmup`` are left out)."""
        ...

    async def nats_ingest(self, stream: str, payloads: Sequence[bytes]) -> float:
        """msg/s: plain NATS publishes on the stream's subject until all are committed."""
        ...


SideFactory = Callable[..., contextlib.AbstractAsyncContextManager[Side]]  # (mode, data_dir, codec, tls=None)


# ---- NATS JetStream ----


class JetStreamSide:
    name = "jetstream"
    batch_reads = False
    idempotence = False
    encryption = False

    def __init__(self, server: JetStreamServer, nc: Any) -> None:
        self.server = server
        self.nc = nc
        self.js = nc.jetstream(publish_async_max_pending=JS_PUBLISH_WINDOW, timeout=30)

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls, mode: str, data_dir: Path, codec: Codec, tls: DevCertificates | None = None
    ) -> AsyncIterator[Side]:
        """``codec`` is tidelog's producer setting: JetStream has nothing to set (streams are uncompressed)."""
        server_tls = (tls.broker_cert, tls.broker_key) if tls is not None else None
        async with JetStreamServer(data_dir, sync_always=mode == "fsync", tls=server_tls) as server:
            log(f"jetstream ({mode}{', tls' if tls else ''}) pid {server.pid} on {server.url}")
            nc = await nats.connect(
                server.url, name="bench-jetstream", pending_size=32 * 1024 * 1024, tls=client_ssl(tls)
            )
            try:
                yield cls(server, nc)
            finally:
                await nc.close()

    async def _create(self, stream: str) -> None:
        await self.js.add_stream(StreamConfig(name=stream, subjects=[stream], storage=StorageType.FILE))

    async def _count(self, stream: str) -> int:
        info = await self.js.stream_info(stream)
        return int(info.state.messages)

    async def produce(self, stream: str, payloads: Sequence[bytes], *, encrypted: bool = False) -> float:
        await self._create(stream)
        return await publish_all(self.js, stream, payloads, deadline_for(len(payloads)))

    async def consume(self, stream: str, count: int, size: int, *, decode: bool = True) -> float:
        return await pull_all(self.nc, self.js, stream, count, size, deadline_for(count))

    async def latencies(
        self, stream: str, payloads: Sequence[bytes], warmup: int, *, idempotent: bool = False
    ) -> list[float]:
        await self._create(stream)
        return await publish_one_at_a_time(self.js, stream, payloads, warmup)

    async def nats_ingest(self, stream: str, payloads: Sequence[bytes]) -> float:
        await self._create(stream)
        return await measure_ingest(self.server.url, stream, payloads, lambda: self._count(stream))


# ---- tidelog ----


class TidelogServer:
    """``tidelog serve`` as a child process (its own interpreter and event loop, as JetStream has its own process),
    with the embedded NATS on a known port and the given default flush policy. Stopped by PID (SIGTERM)."""

    def __init__(
        self,
        data_dir: Path,
        *,
        flush_policy: str,
        metrics: bool = True,
        ready_within: float = 60.0,
        tls: DevCertificates | None = None,
        fronts: int = 0,
    ) -> None:
        self.data_dir = data_dir
        self.fronts = fronts  # api_front_processes
        self.tls = tls
        self.flush_policy = flush_policy
        self.metrics = metrics
        self.ready_within = ready_within
        self.grpc_port, self.wire_port, self.nats_port, self.http_port = free_ports(4, _LOOPBACK)
        self._process: ManagedProcess | None = None

    @property
    def nats_url(self) -> str:
        return f"nats://{_LOOPBACK}:{self.nats_port}"

    @property
    def bootstrap(self) -> str:
        return f"{_LOOPBACK}:{self.wire_port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _env(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith("TIDELOG_")}
        env.update(
            TIDELOG_DEFAULT_FLUSH_POLICY=self.flush_policy,
            TIDELOG_EMBEDDED_NATS_PORT=str(self.nats_port),
            TIDELOG_LOG_LEVEL="warning",
            TIDELOG_HTTP_PORT=str(self.http_port),
            TIDELOG_METRICS_ENABLED=str(self.metrics).lower(),
            TIDELOG_ENCRYPTION_KEY=base64.b64encode(os.urandom(32)).decode(),  # for the encrypted stream alone
        )
        if self.fronts:
            env.update(TIDELOG_API_FRONT_PROCESSES=str(self.fronts))
        if self.tls is not None:
            env.update(TIDELOG_TLS_CERT=str(self.tls.broker_cert), TIDELOG_TLS_KEY=str(self.tls.broker_key))
        return env

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        script = Path(sys.executable).with_name("tidelog")  # the venv's console script
        argv = [str(script)] if script.exists() else [sys.executable, "-c", "from tidelog.cli.main import main; main()"]
        argv += ["serve", "--data-dir", str(self.data_dir), "--port", str(self.grpc_port)]
        argv += ["--wire-port", str(self.wire_port)]
        self._process = ManagedProcess(argv, log_path=self.data_dir / "broker.log", name="tidelog", env=self._env())
        # gRPC starts last, once the broker is registered and the wire protocol is listening.
        ready = all_of(tcp_probe(_LOOPBACK, self.wire_port), tcp_probe(_LOOPBACK, self.grpc_port))
        await self._process.start(ready, ready_within=self.ready_within)

    async def stop(self) -> None:
        if self._process is not None:
            await self._process.stop(grace=30)

    async def __aenter__(self) -> TidelogServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class TidelogSide:
    name = "tidelog"
    batch_reads = True
    idempotence = True
    encryption = True

    def __init__(self, server: TidelogServer, cluster: Cluster, codec: Codec) -> None:
        self.server = server
        self.cluster = cluster
        self.admin = Admin(cluster=cluster)
        self.codec = codec

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls, mode: str, data_dir: Path, codec: Codec, tls: DevCertificates | None = None, *, metrics: bool = True
    ) -> AsyncIterator[Side]:
        policy = "always" if mode == "fsync" else "never"
        async with TidelogServer(data_dir, flush_policy=policy, tls=tls, metrics=metrics) as server:
            tag = ", tls" if tls else ""
            log(f"tidelog ({mode}, flush {policy}{tag}) pid {server.pid}, wire {server.wire_port}, {server.nats_url}")
            cluster = Cluster(server.bootstrap, ssl=client_ssl(tls))
            try:
                yield cls(server, cluster, codec)
            finally:
                await cluster.close()

    async def _create(self, stream: str, *, encrypted: bool = False) -> None:
        await self.admin.create_stream(stream, stream, config={"encryption": True} if encrypted else None)

    async def _committed(self, stream: str) -> int:
        """Messages committed in partition 0: its high watermark (exclusive: one past the last committed)."""
        info = await self.admin.describe_stream(stream)
        return int(info.partitions[0].high_watermark)

    def _producer(self, **settings: Any) -> Producer:
        settings.setdefault("idempotent", False)  # like js.publish without a Nats-Msg-Id (module docstring)
        return Producer(cluster=self.cluster, acks=Acks.ALL, compression=self.codec, **settings)

    async def produce(self, stream: str, payloads: Sequence[bytes], *, encrypted: bool = False) -> float:
        await self._create(stream, encrypted=encrypted)
        return await produce_all(self._producer(), stream, payloads)

    async def consume(self, stream: str, count: int, size: int, *, decode: bool = True) -> float:
        """Decode every record of every fetched batch (the values are what is read back); without ``decode``,
        count the records of each CRC-checked batch from its header."""
        got = received_bytes = 0
        start = time.perf_counter()
        async with Consumer(stream=stream, cluster=self.cluster, start="earliest", stop_at_end=True) as consumer:
            async with asyncio.timeout(deadline_for(count)):
                async for batch in consumer.fetch_batches():
                    if decode:
                        records = batch.records()
                        got += len(records)
                        received_bytes += sum(len(record.value or b"") for record in records)
                    else:
                        got += batch.record_count
        elapsed = time.perf_counter() - start
        if not decode:
            received_bytes = count * size  # not looked at; the batches' CRCs were checked
        if got != count or received_bytes != count * size:
            raise RuntimeError(f"tidelog {stream}: read {got} records, {received_bytes} bytes; expected {count}")
        return count / elapsed

    async def latencies(
        self, stream: str, payloads: Sequence[bytes], warmup: int, *, idempotent: bool = False
    ) -> list[float]:
        await self._create(stream)
        producer = self._producer(linger_ms=0, idempotent=idempotent)
        await producer.start()
        out: list[float] = []
        try:
            for i, payload in enumerate(payloads):
                start = time.perf_counter_ns()
                await producer.send_and_wait(stream, payload)
                if i >= warmup:
                    out.append((time.perf_counter_ns() - start) / 1000)
        finally:
            await producer.close()
        return out

    async def nats_ingest(self, stream: str, payloads: Sequence[bytes]) -> float:
        await self._create(stream)
        return await measure_ingest(self.server.nats_url, stream, payloads, lambda: self._committed(stream))


# ---- the run ----

SIDES: dict[str, SideFactory] = {"jetstream": JetStreamSide.open, "tidelog": TidelogSide.open}

Samples = dict[tuple[str, str], list[float]]
