"""docs/deployment.md, run on one machine: its marked commands, as written, on three loopback "hosts".

Each host of the guide (``10.0.0.N``) becomes a loopback address of its own (``127.0.0.1N``), each of the guide's
ports a free port (the same on every address, as the guide uses the same ports on every host), and ``/var/lib``
and ``/etc`` a temporary directory per host. Everything else in the commands is run unchanged through ``bash``:
three etcd members forming a real cluster, three nats-servers joined by routes, three ``tidelog serve`` brokers
with their own data directories, then the guide's client commands. One broker is restarted as an upgrade
restarts it (SIGTERM, the same command, back in every ISR); then one etcd member, one NATS server and one
broker are killed by PID, and the stream must still take and serve messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aetcd
import nats
import pytest

from tests.helpers import BOUND, LONG_BOUND
from tidelog.launch.ports import free_port
from tidelog.launch.probes import ReadinessProbe, http_get, http_probe
from tidelog.launch.process import ManagedProcess
from tidelog.local.serve_process import clean_env, serving
from tidelog.metadata.records import Keys, decode_partition

DOC = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"
_BLOCK = re.compile(r"<!-- deployment: (?P<name>\S+)(?: (?P<path>\S+))? -->\n```[a-z]*\n(?P<body>.*?)```", re.DOTALL)
GUIDE_PORTS = (2379, 2380, 4222, 6222, 8222, 9292, 9293)
_GUIDE_PORT = re.compile(r"\b(" + "|".join(map(str, GUIDE_PORTS)) + r")\b")
_GUIDE_HOST = re.compile(r"\b10\.0\.0\.([1-3])\b")
HOSTS = (1, 2, 3)
VENV_BIN = Path(sys.executable).parent
# Failure detection faster than the guide's defaults, so that the test waits seconds rather than tens of them.
QUICK_FAILOVER = {"TIDELOG_BROKER_LEASE_TTL_MS": "3000", "TIDELOG_REPLICA_LAG_TIME_MAX_MS": "4000"}
FAILOVER_WITHIN = 2 * LONG_BOUND


@dataclass(frozen=True)
class Block:
    """A command or file of the guide: its marker name, the path the file goes to, its text."""

    name: str
    path: str | None
    body: str


def guide_blocks() -> dict[str, Block]:
    text = DOC.read_text()
    found = [Block(m["name"], m["path"], m["body"]) for m in _BLOCK.finditer(text)]
    return {block.name: block for block in found}


def _bindable_everywhere(port: int) -> bool:
    for host in HOSTS:
        with socket.socket() as sock:
            try:
                sock.bind((address(host), port))
            except OSError:
                return False
    return True


def address(host: int) -> str:
    return f"127.0.0.1{host}"


@dataclass
class Loopback:
    """The guide's three hosts on this machine, and every process started for them."""

    root: Path
    ports: dict[int, int] = field(default_factory=dict)
    processes: list[ManagedProcess] = field(default_factory=list)

    def __post_init__(self) -> None:
        taken: set[int] = set()
        for guide_port in GUIDE_PORTS:
            for _ in range(50):
                port = free_port(address(1))
                if port not in taken and _bindable_everywhere(port):
                    break
            else:
                raise RuntimeError("no port free on all three loopback addresses")
            taken.add(port)
            self.ports[guide_port] = port

    def localize(self, text: str, host: int | None = None) -> str:
        """The guide's text with its hosts, ports and (for a host's own commands) directories made local."""
        text = _GUIDE_HOST.sub(lambda m: address(int(m[1])), text)
        text = _GUIDE_PORT.sub(lambda m: str(self.ports[int(m[1])]), text)
        if host is not None:
            text = text.replace("/var/lib/", f"{self.root}/host{host}/var/lib/")
            text = text.replace("/etc/", f"{self.root}/host{host}/etc/")
        return text

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in clean_env(**extra).items() if not k.startswith("ETCD_")}
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
        return env

    def install(self, block: Block) -> None:
        """Write a configuration file of the guide on every host."""
        assert block.path is not None
        for host in HOSTS:
            path = Path(self.localize(block.path, host))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self.localize(block.body, host))

    async def start_on_each_host(
        self, block: Block, probe: Callable[[int], ReadinessProbe], **settings: str
    ) -> list[ManagedProcess]:
        """Run ``block`` on every host at once (etcd's members need each other to become ready)."""
        started = []
        for host in HOSTS:
            (self.root / f"host{host}" / "var" / "lib").mkdir(parents=True, exist_ok=True)
            process = ManagedProcess(
                ["bash", "-c", "exec " + self.localize(block.body, host)],
                log_path=self.root / f"host{host}" / f"{block.name}.log",
                name=f"{block.name}{host}",
                env=self.env(N=str(host), HOST=address(host), **settings),
            )
            self.processes.append(process)
            started.append(process)
        await asyncio.gather(
            *(each.start(probe(host), ready_within=LONG_BOUND) for host, each in zip(HOSTS, started, strict=True))
        )
        return started

    async def run(self, block: Block, *, replace: tuple[str, str] | None = None) -> tuple[int, str, str]:
        """Run a client command of the guide; its exit status, standard output and standard error."""
        command = self.localize(block.body)
        if replace is not None:
            assert replace[0] in command
            command = command.replace(*replace)
        child = await asyncio.create_subprocess_exec(
            "bash", "-c", command, env=self.env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            out, err = await asyncio.wait_for(child.communicate(), LONG_BOUND)
        except TimeoutError:
            child.kill()
            await child.wait()
            raise
        assert child.returncode is not None
        return child.returncode, out.decode(), err.decode()

    async def run_until_ok(self, block: Block, *, replace: tuple[str, str] | None = None) -> str:
        """Run a client command until it succeeds (a failover in progress), within :data:`FAILOVER_WITHIN`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FAILOVER_WITHIN
        delay = 0.2
        while True:
            code, out, err = await self.run(block, replace=replace)
            if code == 0:
                return out
            if loop.time() + delay > deadline:
                raise AssertionError(f"{block.name} still fails after {FAILOVER_WITHIN:g}s: {err.strip()}")
            await asyncio.sleep(delay)  # back-off between attempts; the attempt itself is what is waited on
            delay = min(delay * 2, 3.0)

    async def stop_all(self) -> None:
        for process in reversed(self.processes):  # brokers first, then NATS, then etcd
            with contextlib.suppress(Exception):
                await process.stop(grace=BOUND)


async def wait_for(check: Callable[[], Awaitable[bool]], within: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    delay = 0.05
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"not {what} after {within:g}s")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)


async def stream_whole(host: str, port: int, stream: str) -> bool:
    """Whether every partition of ``stream`` has its whole replica set in its ISR (read straight from etcd)."""
    async with aetcd.Client(host=host, port=port, timeout=int(BOUND)) as client:
        found = await asyncio.wait_for(client.get_prefix(Keys().partitions_of(stream)), BOUND)
    records = [decode_partition(bytes(each.value)) for each in found]
    return bool(records) and all(set(record.isr) == set(record.replicas) for record in records)


async def publish_nats(url: str, subject: str, payload: bytes, *, msg_id: str) -> None:
    client = await nats.connect(url, allow_reconnect=False, connect_timeout=BOUND)
    try:
        await client.publish(subject, payload, headers={"Nats-Msg-Id": msg_id})
        await client.flush(timeout=BOUND)
    finally:
        await client.close()


@pytest.fixture
async def loopback(tmp_path: Path) -> AsyncIterator[Loopback]:
    hosts = Loopback(tmp_path)
    try:
        yield hosts
    finally:
        await hosts.stop_all()


def test_guide_marks_every_block_the_test_runs() -> None:
    blocks = guide_blocks()
    run_in_order = ["etcd", "nats-conf", "nats", "tidelog-conf", "tidelog", "create", "publish", "status", "subscribe"]
    assert list(blocks) == run_in_order
    assert blocks["nats-conf"].path and blocks["tidelog-conf"].path


@pytest.mark.slow
async def test_three_hosts_survive_losing_an_etcd_member_a_nats_server_and_a_broker(loopback: Loopback) -> None:
    blocks = guide_blocks()
    ports = loopback.ports

    def etcd_healthy(host: int) -> ReadinessProbe:
        return http_probe(f"http://{address(host)}:{ports[2379]}/health", body_contains=b'"health":"true"')

    def nats_healthy(host: int) -> ReadinessProbe:
        return http_probe(f"http://{address(host)}:{ports[8222]}/healthz")

    def broker_serving(host: int) -> ReadinessProbe:
        return serving(ports[9292], address(host))

    etcds = await loopback.start_on_each_host(blocks["etcd"], etcd_healthy)
    loopback.install(blocks["nats-conf"])
    natses = await loopback.start_on_each_host(blocks["nats"], nats_healthy)

    async def routed() -> bool:
        for host in HOSTS:
            _, body = await http_get(f"http://{address(host)}:{ports[8222]}/routez")
            if len({route["remote_id"] for route in json.loads(body).get("routes") or []}) != 2:
                return False
        return True

    await wait_for(routed, LONG_BOUND, "every NATS server routed to the other two")
    loopback.install(blocks["tidelog-conf"])
    brokers = await loopback.start_on_each_host(blocks["tidelog"], broker_serving, **QUICK_FAILOVER)

    code, _, err = await loopback.run(blocks["create"])
    assert code == 0, err
    await loopback.run_until_ok(blocks["publish"])
    status = await loopback.run_until_ok(blocks["status"])
    assert all(f"tidelog{host}" in status for host in HOSTS), status

    # An upgrade, one broker at a time (the guide's steps): the cluster is whole; SIGTERM, the broker exits 0;
    # the same command starts it again on its data directory; it is ready and back in every ISR.
    async def whole() -> bool:
        return await stream_whole(address(1), ports[2379], "orders")

    await wait_for(whole, FAILOVER_WITHIN, "every partition's ISR whole")
    assert await brokers[0].stop(grace=LONG_BOUND) == 0
    await brokers[0].start(broker_serving(1), ready_within=LONG_BOUND)
    await wait_for(whole, FAILOVER_WITHIN, "broker 1 back in every ISR after its restart")

    # One of each, each on another host: the etcd member of host 2 (host 2's broker lists it first and must move
    # to another member), the NATS server of host 1 (host 1's broker must move to another), the broker of host 3.
    await etcds[1].kill()
    await natses[0].kill()
    await brokers[2].kill()

    await loopback.run_until_ok(blocks["publish"], replace=("first second third", "fourth fifth sixth"))
    expected = {"first", "second", "third", "fourth", "fifth", "sixth", "seventh"}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FAILOVER_WITHIN
    while True:
        # A plain NATS message to host 2's server reaches partition 0's leader through the routes, wherever it
        # is connected. NATS delivers at most once (a leader reconnecting misses it), so it is sent again until
        # it is stored; its Nats-Msg-Id lets the leader store it once.
        await publish_nats(f"nats://{address(2)}:{ports[4222]}", "orders", b"seventh", msg_id="seventh")
        values = (await loopback.run_until_ok(blocks["subscribe"])).split()
        if set(values) == expected or loop.time() > deadline:
            break
        await asyncio.sleep(0.5)  # a follower may still be catching up: ask again
    assert set(values) == expected
    assert all(values.count(each) == 1 for each in ("first", "second", "third")), values
    status = await loopback.run_until_ok(blocks["status"])
    assert "tidelog1" in status and "tidelog2" in status, status

    # SIGTERM: the surviving brokers shut down cleanly.
    assert await brokers[0].stop(grace=LONG_BOUND) == 0
    assert await brokers[1].stop(grace=LONG_BOUND) == 0
