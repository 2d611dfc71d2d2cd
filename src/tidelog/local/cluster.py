"""A local multi-process tidelog cluster: one nats-server, one etcd and N ``tidelog serve`` brokers, on free
loopback ports, for fault tests, benchmarks and ``tidelog dev-cluster``.

::

    async with LocalCluster(tmp_path, brokers=3, settings={"broker_lease_ttl_ms": "2000"}) as cluster:
        async with Admin(cluster.bootstrap()) as admin: ...
        await cluster.kill("b1")                      # SIGKILL by PID
        await cluster.wait_until(lambda: ..., 30, "b1's partitions to fail over")
        await cluster.restart("b1")                   # same id, ports and data; back when serving + registered

Brokers are real processes (``tidelog serve --id bI --nats-servers … --etcd-endpoints …``) so that a crash is a
real crash: SIGKILL, SIGSTOP and a lost lease behave as in production. Each broker has its own data directory
(``<root>/bI/data``) and log (``<root>/bI/serve.log``); NATS and etcd keep theirs under ``<root>/nats`` and
``<root>/etcd``. Every port is chosen once, up front, and kept for restarts, so addresses held by clients and by
etcd metadata stay valid.

A broker counts as up when its gRPC health service says SERVING *and* etcd holds its registration
(``/tidelog/brokers/<id>``) written by this run of it (``started_ns`` after the start was requested): after a
SIGKILL the previous run's key outlives the process until its lease lapses, and must not be mistaken for the new
one.

Children never outlive the test: :class:`~tidelog.launch.process.ManagedProcess` stops them at interpreter exit
and asks the kernel to SIGKILL them if the test process dies (``PR_SET_PDEATHSIG``). Brokers are therefore
started from the event loop's thread, never from a worker thread.

``proxied=True`` puts a :class:`~tidelog.local.tcp_proxy.TcpProxy` in front of each broker's wire port and has
the broker advertise the proxy, so :meth:`LocalCluster.isolate` cuts it off from clients and from the followers
fetching from it. That needs a broker setting to advertise a wire port other than the one it listens on; until
``BrokerConfig`` has one, ``proxied=True`` raises :class:`NotImplementedError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import aetcd

from tidelog.broker.config import config_keys
from tidelog.broker.config_values import parse_etcd_endpoint
from tidelog.broker.embedded import EmbeddedEtcd, EmbeddedNats
from tidelog.launch.ports import free_ports
from tidelog.launch.probes import ReadinessProbe, all_of
from tidelog.launch.process import ManagedProcess
from tidelog.local.certificates import DevCertificates, make_dev_certificates
from tidelog.local.serve_process import TIDELOG, clean_env, serving
from tidelog.local.tcp_proxy import TcpProxy
from tidelog.metadata.etcd_client import open_etcd
from tidelog.metadata.namespace import DEFAULT_NAMESPACE, namespace_keys
from tidelog.metadata.records import (
    BrokerRecord,
    ControllerRecord,
    PartitionRecord,
    decode_broker,
    decode_controller,
    decode_partition,
)
from tidelog.protocol.tls import TlsFiles, client_context

__all__ = ["ADVERTISE_WIRE_PORT_KEYS", "BrokerHandle", "LocalCluster", "Placement"]

START_WITHIN = 60.0  # Python start-up on a loaded 2-core machine, several brokers at once
STOP_GRACE = 30.0  # SIGTERM → exit: a controlled shutdown hands leadership off first (shutdown_timeout_ms)
KILL_WAIT = 10.0
ETCD_TIMEOUT = 10.0
ADVERTISE_WIRE_PORT_KEYS = ("advertise_wire_port", "advertised_wire_port")
"""Names the broker setting that advertises a wire port other than the listened one may have (for ``proxied``)."""


@dataclass(eq=False)
class BrokerHandle:
    """One broker of a :class:`LocalCluster`: its identity, ports, data and process. Ports never change."""

    id: str
    port: int
    wire_port: int
    data_dir: Path
    process: ManagedProcess
    proxy: TcpProxy | None = None
    http_port: int = 0  # /metrics, /healthz, /readyz
    host: str = "127.0.0.1"  # the address it listens on and advertises (its own with placements)
    paused: bool = field(default=False, init=False)

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def running(self) -> bool:
        """The process exists and has not exited (a paused broker is running)."""
        return self.process.running

    @property
    def advertised_wire_port(self) -> int:
        """The wire port clients and peers are told: the proxy's when proxied."""
        return self.proxy.port if self.proxy is not None else self.wire_port

    @property
    def wire_address(self) -> str:
        """``host:port`` of the wire protocol as advertised (through the proxy when proxied)."""
        return f"{self.host}:{self.advertised_wire_port}"

    @property
    def direct_wire_address(self) -> str:
        """The wire listener itself, bypassing any proxy."""
        return f"{self.host}:{self.wire_port}"

    @property
    def grpc_address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def http_url(self) -> str:
        """``http://host:port`` of the broker's HTTP port (``/metrics``, ``/healthz``, ``/readyz``)."""
        return f"http://{self.host}:{self.http_port}"


class Placement(Protocol):
    """Where one process of a cluster runs: an address of its own, and the command that runs a program there."""

    @property
    def address(self) -> str: ...

    def command(self, argv: Sequence[str | os.PathLike[str]]) -> list[str]: ...


class _Placed:
    """The cluster's placements, or loopback and the command itself for every process without them."""

    def __init__(self, placements: Mapping[str, Placement] | None) -> None:
        self._placements = placements

    def address(self, name: str) -> str:
        return "127.0.0.1" if self._placements is None else self._placements[name].address

    def embedded(self, name: str) -> dict[str, Any]:
        """``host`` and ``launcher`` for :class:`EmbeddedNats` / :class:`EmbeddedEtcd`."""
        if self._placements is None:
            return {}
        placement = self._placements[name]
        return {"host": placement.address, "launcher": placement.command}


def _settings_env(settings: Mapping[str, str]) -> dict[str, str]:
    """``{"broker_lease_ttl_ms": "2000"}`` or ``{"TIDELOG_BROKER_LEASE_TTL_MS": "2000"}`` → ``TIDELOG_*``."""
    env: dict[str, str] = {}
    for key, value in settings.items():
        name = key.upper() if key.upper().startswith("TIDELOG_") else f"TIDELOG_{key.upper()}"
        env[name] = str(value)
    return env


def _is_stopped(pid: int | None) -> bool | None:
    """Whether ``pid`` is stopped by a signal (state ``T``); ``None`` where ``/proc`` cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[:1] == ["T"]


def _advertise_key() -> str | None:
    keys = set(config_keys())
    return next((k for k in ADVERTISE_WIRE_PORT_KEYS if k in keys), None)


class LocalCluster:
    """N brokers sharing one NATS and one etcd, each a child process stopped by PID. See the module docstring."""

    def __init__(
        self,
        root: Path,
        brokers: int = 3,
        *,
        settings: Mapping[str, str] | None = None,
        proxied: bool = False,
        base_port: int | None = None,
        start_within: float = START_WITHIN,
        tls: bool = False,
        placements: Mapping[str, Placement] | None = None,
        etcd_endpoints: Sequence[str] | None = None,
    ) -> None:
        """``settings`` are broker configuration keys (``replica_lag_time_max_ms``) given to every broker as
        ``TIDELOG_*`` variables. ``base_port`` makes ports predictable (``tidelog dev-cluster``): broker I gets
        gRPC ``base+2I`` and wire ``base+2I+1``, then NATS, its monitor, etcd client and peer, then proxies, then
        each broker's HTTP port. Without it every port is a free one.

        ``tls=True`` makes a throwaway CA under ``<root>/tls`` (:mod:`tidelog.local.certificates`) and runs every
        broker with TLS on both listeners, client certificates required, TLS between brokers, and so
        authorization on, with the principal ``admin`` a super user: :attr:`client_tls` holds the files a client
        connects with as ``admin``, :meth:`client_ssl` a context from them; :attr:`user_tls` the files of the
        principal ``client``, which ACLs must grant what it does.

        ``placements`` run each process on a host of its own (``"nats"``, ``"etcd"``, ``"b0"``…, every one
        needed): it listens on the placement's address and runs through its command, e.g. a
        :class:`tidelog.testing.netlab.NetLab` host, so that tests can partition the network between them.

        ``etcd_endpoints``: an etcd the caller runs (a three-member cluster, whose members a test kills), instead
        of the embedded one."""
        if brokers < 1:
            raise ValueError(f"a cluster needs at least one broker, got {brokers}")
        if placements is not None:
            needed = ["nats", "etcd", *(f"b{index}" for index in range(brokers))]
            missing = [name for name in needed if name not in placements]
            if missing:
                raise ValueError(f"placements must name every process; missing: {', '.join(missing)}")
            if proxied:
                raise ValueError("proxied=True and placements do not go together: partition the network instead")
        advertise_key = _advertise_key()
        if proxied and advertise_key is None:
            raise NotImplementedError(
                "proxied clusters need a broker setting that advertises a wire port other than the listened one "
                f"(one of {', '.join(ADVERTISE_WIRE_PORT_KEYS)}); BrokerConfig has none yet"
            )
        self.root = Path(root)
        self.proxied = proxied
        self.start_within = start_within
        self._external_etcd = list(etcd_endpoints) if etcd_endpoints else None
        self.keys = namespace_keys((settings or {}).get("namespace", DEFAULT_NAMESPACE))
        proxies = brokers if proxied else 0
        count = 2 * brokers + 4 + proxies + brokers
        ports = list(range(base_port, base_port + count)) if base_port is not None else free_ports(count)
        nats_port, monitor_port, etcd_port, peer_port = ports[2 * brokers : 2 * brokers + 4]
        placed = _Placed(placements)
        self._nats = EmbeddedNats(
            self.root / "nats", port=nats_port, monitor_port=monitor_port, **placed.embedded("nats")
        )
        self._etcd = EmbeddedEtcd(
            self.root / "etcd", client_port=etcd_port, peer_port=peer_port, **placed.embedded("etcd")
        )
        self.certificates: DevCertificates | None = None
        tls_settings: dict[str, str] = {}
        if tls:
            self.certificates = make_dev_certificates(self.root / "tls")
            tls_settings = {
                "tls_cert": str(self.certificates.broker_cert),
                "tls_key": str(self.certificates.broker_key),
                "tls_client_ca": str(self.certificates.ca),
                "tls_ca": str(self.certificates.ca),
                "tls_client_auth": "required",
                "super_users": "admin",  # authorization is on (client auth required): admin.pem may do anything
            }
        base_env = clean_env(**_settings_env({**tls_settings, **(settings or {})}))
        self.brokers: list[BrokerHandle] = []
        for index in range(brokers):
            broker_id = f"b{index}"
            port, wire_port = ports[2 * index], ports[2 * index + 1]
            http_port = ports[2 * brokers + 4 + proxies + index]
            env = dict(base_env)
            proxy = None
            if proxied and advertise_key is not None:
                proxy = TcpProxy("127.0.0.1", wire_port, port=ports[2 * brokers + 4 + index])
                env[f"TIDELOG_{advertise_key.upper()}"] = str(proxy.port)
            data_dir = self.root / broker_id / "data"
            argv = [
                str(TIDELOG), "serve",
                "--id", broker_id,
                "--data-dir", str(data_dir),
                "--port", str(port),
                "--wire-port", str(wire_port),
                "--http-port", str(http_port),
                "--nats-servers", self.nats_url,
                "--etcd-endpoints", ",".join(self.etcd_endpoints),
            ]  # fmt: skip
            host = placed.address(broker_id)
            if placements is not None:
                argv = placements[broker_id].command([*argv, "--host", host])
            process = ManagedProcess(argv, log_path=self.root / broker_id / "serve.log", name=broker_id, env=env)
            self.brokers.append(BrokerHandle(broker_id, port, wire_port, data_dir, process, proxy, http_port, host))
        self._etcd_client: Any = None
        self._stopping = False

    # ---- addresses ----

    @property
    def client_tls(self) -> TlsFiles | None:
        """The CA and the super user's certificate (principal ``admin``) to connect with (None without ``tls``)."""
        c = self.certificates
        return None if c is None else TlsFiles(ca=c.ca, cert=c.admin_cert, key=c.admin_key)

    @property
    def user_tls(self) -> TlsFiles | None:
        """The CA and an ordinary client's certificate (principal ``client``: only what ACLs allow)."""
        c = self.certificates
        return None if c is None else TlsFiles(ca=c.ca, cert=c.client_cert, key=c.client_key)

    def client_ssl(self) -> ssl.SSLContext | None:
        """A client TLS context for the brokers' wire ports (None without ``tls``)."""
        files = self.client_tls
        return None if files is None else client_context(files)

    @property
    def nats_url(self) -> str:
        return self._nats.url

    @property
    def etcd_endpoints(self) -> list[str]:
        return list(self._external_etcd) if self._external_etcd else self._etcd.endpoints

    @property
    def nats(self) -> EmbeddedNats:
        return self._nats

    @property
    def etcd(self) -> EmbeddedEtcd:
        return self._etcd

    def broker(self, broker_id: str) -> BrokerHandle:
        for handle in self.brokers:
            if handle.id == broker_id:
                return handle
        raise KeyError(f"no broker {broker_id!r} in this cluster (it has {', '.join(b.id for b in self.brokers)})")

    def bootstrap(self) -> list[str]:
        """Wire addresses of the brokers running and not paused (a paused one would only make clients wait)."""
        return [b.wire_address for b in self.brokers if b.running and not b.paused]

    # ---- lifecycle ----

    async def start(self) -> None:
        """Start NATS and etcd, then every broker at once; return when all serve and are registered.

        On failure everything started is stopped before the error (a :class:`ProcessStartError` naming the
        broker and the tail of its log) propagates.
        """
        self._stopping = False
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            await asyncio.gather(self._nats.start(), *([] if self._external_etcd else [self._etcd.start()]))
            await self._client()
            for handle in self.brokers:
                if handle.proxy is not None:
                    await handle.proxy.start()
            async with asyncio.TaskGroup() as group:
                for handle in self.brokers:
                    if not handle.running:
                        group.create_task(self._start_broker(handle))
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """SIGTERM every broker by PID (waking paused ones first), then stop NATS and etcd; idempotent."""
        self._stopping = True
        for handle in self.brokers:
            self._resume_quietly(handle)
        results = await asyncio.gather(
            *(b.process.stop(grace=STOP_GRACE) for b in self.brokers), return_exceptions=True
        )
        for handle in self.brokers:
            if handle.proxy is not None:
                await handle.proxy.close()
        if self._etcd_client is not None:
            client, self._etcd_client = self._etcd_client, None
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), ETCD_TIMEOUT)
        await asyncio.gather(self._nats.stop(), self._etcd.stop(), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def __aenter__(self) -> LocalCluster:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # ---- one broker ----

    async def kill(self, broker_id: str) -> None:
        """SIGKILL the broker (no shutdown of any kind) and wait until it is gone."""
        handle = self.broker(broker_id)
        if not handle.running:
            return
        handle.paused = False
        await handle.process.kill()

    async def pause(self, broker_id: str) -> None:
        """SIGSTOP: the broker keeps its sockets and lease but does nothing, as a long GC pause or a hung VM.

        Returns once the kernel reports the process stopped (signal delivery is asynchronous)."""
        handle = self.broker(broker_id)
        handle.process.signal(signal.SIGSTOP)
        handle.paused = True
        await self._await_state(handle, stopped=True)

    async def resume(self, broker_id: str) -> None:
        """SIGCONT a paused broker; returns once it runs again."""
        handle = self.broker(broker_id)
        handle.process.signal(signal.SIGCONT)
        handle.paused = False
        await self._await_state(handle, stopped=False)

    async def _await_state(self, handle: BrokerHandle, *, stopped: bool) -> None:
        what = f"broker {handle.id} to {'stop' if stopped else 'continue'}"
        await self.wait_until(lambda: _is_stopped(handle.pid) in (stopped, None), KILL_WAIT, what)

    async def stop_broker(self, broker_id: str) -> int | None:
        """SIGTERM (a controlled shutdown) and wait for the exit; returns its exit status."""
        handle = self.broker(broker_id)
        self._resume_quietly(handle)
        return await handle.process.stop(grace=STOP_GRACE)

    async def restart(self, broker_id: str) -> None:
        """Start a stopped or killed broker again with the same id, ports and data; return when serving and
        registered anew."""
        handle = self.broker(broker_id)
        if handle.running:
            raise RuntimeError(f"broker {broker_id} is still running (pid {handle.pid}): kill or stop it first")
        await self._start_broker(handle)

    async def isolate(self, broker_id: str) -> None:
        """Cut the broker's wire traffic: clients and followers fetching from it lose their connections and new
        ones are black-holed. Its etcd lease, its NATS connection and its own fetches from other leaders stay."""
        self._proxy(broker_id).cut()

    async def heal(self, broker_id: str) -> None:
        self._proxy(broker_id).heal()

    def _proxy(self, broker_id: str) -> TcpProxy:
        proxy = self.broker(broker_id).proxy
        if proxy is None:
            raise RuntimeError("isolate/heal need LocalCluster(proxied=True)")
        return proxy

    async def _start_broker(self, handle: BrokerHandle) -> None:
        since = time.time_ns()
        handle.paused = False
        await handle.process.start(
            all_of(serving(handle.port, handle.host, tls=self.client_tls), self._registered(handle, since)),
            ready_within=self.start_within,
        )

    def _registered(self, handle: BrokerHandle, since_ns: int) -> ReadinessProbe:
        async def probe() -> bool:
            record = await self.broker_record(handle.id)
            return (
                record is not None and record.started_ns >= since_ns and record.wire_port == handle.advertised_wire_port
            )

        return probe

    def _resume_quietly(self, handle: BrokerHandle) -> None:
        if handle.paused and handle.running:
            with contextlib.suppress(ProcessLookupError, RuntimeError):
                handle.process.signal(signal.SIGCONT)
        handle.paused = False

    # ---- metadata (read straight from etcd) ----

    async def _client(self) -> Any:
        if self._etcd_client is None:
            self._etcd_client = await self.etcd_client()
        return self._etcd_client

    async def etcd_client(self) -> aetcd.Client:
        """A new, connected etcd client over every endpoint (it fails over between them); the caller closes it."""
        client = open_etcd([parse_etcd_endpoint(e) for e in self.etcd_endpoints], timeout=int(ETCD_TIMEOUT))
        await asyncio.wait_for(client.connect(), ETCD_TIMEOUT)
        return client

    async def _get(self, key: bytes) -> bytes | None:
        client = await self._client()
        found = await asyncio.wait_for(client.get(key), ETCD_TIMEOUT)
        return None if found is None else bytes(found.value)

    async def broker_record(self, broker_id: str) -> BrokerRecord | None:
        """The broker's registration; present while its lease lives."""
        value = await self._get(self.keys.broker(broker_id))
        return None if value is None else decode_broker(value)

    async def registered_brokers(self) -> dict[str, BrokerRecord]:
        """Every broker with a live registration, by id."""
        client = await self._client()
        found = await asyncio.wait_for(client.get_prefix(self.keys.brokers.encode()), ETCD_TIMEOUT)
        records = (decode_broker(bytes(kv.value)) for kv in found)
        return {record.id: record for record in records}

    async def controller(self) -> ControllerRecord | None:
        value = await self._get(self.keys.controller())
        return None if value is None else decode_controller(value)

    async def controller_id(self) -> str | None:
        """The controller's broker id; ``None`` while no broker holds the controller key."""
        record = await self.controller()
        return None if record is None else record.broker_id

    async def partition_record(self, stream: str, partition: int) -> PartitionRecord | None:
        value = await self._get(self.keys.partition(stream, partition))
        return None if value is None else decode_partition(value)

    # ---- waiting ----

    async def wait_until(self, predicate: Callable[[], bool | Awaitable[bool]], timeout: float, what: str) -> None:
        """Poll ``predicate`` (sync or async) with back-off until it is true; ``TimeoutError`` naming ``what``.

        For states only visible by asking (etcd keys, a broker's answer); prefer a watch or a long poll where
        one exists. A predicate that raises counts as "not yet"; its last error is in the timeout's message.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        delay, last_error = 0.02, ""
        while True:
            try:
                result = predicate()
                if inspect.isawaitable(result):
                    result = await asyncio.wait_for(result, max(0.01, deadline - loop.time()))
                if result:
                    return
            except Exception as exc:  # the predicate failing (or timing out) means "not yet"
                last_error = f" (last error: {exc!r})"
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}{last_error}")
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.25)
