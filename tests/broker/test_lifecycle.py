"""``tidelog serve`` as an operator runs it: a real process on free ports, stopped by SIGTERM, restarted on its data.

Each test starts the broker command (which spawns its own nats-server and etcd) through ``ManagedProcess`` and
waits for the gRPC health service to answer SERVING. Children are found by scanning ``/proc`` for processes
whose parent is the broker.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest

from tests.helpers import BOUND
from tidelog.launch.ports import free_ports
from tidelog.launch.probes import tcp_probe
from tidelog.launch.process import ManagedProcess, pid_alive, wait_pid_exit
from tidelog.local.serve_process import TIDELOG, serving
from tidelog.protocol._gen import api_pb2, api_pb2_grpc

from .helpers import bounded, create_stream, publish, read_until_stop, values

pytestmark = pytest.mark.slow

START_WITHIN = 60.0  # Python start-up plus etcd and nats-server on a loaded machine
STOP_WITHIN = 20.0


def clean_env(**settings: str) -> dict[str, str]:
    """Our environment without any TIDELOG_* setting, plus ``settings``. NATS on a free port, not 4222."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDELOG_")}
    env["TIDELOG_EMBEDDED_NATS_PORT"] = "0"
    env["TIDELOG_HTTP_PORT"] = "0"
    env.update(settings)
    return env


def serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> ManagedProcess:
    return ManagedProcess(
        [TIDELOG, "serve", "--data-dir", tmp_path / "data", *args],
        log_path=tmp_path / "serve.log",
        name="tidelog-serve",
        env=env if env is not None else clean_env(),
    )


def children_of(pid: int) -> dict[int, str]:
    """PID → command name of every live process whose parent is ``pid``."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="ascii", errors="replace")
        except OSError:
            continue  # exited while we looked
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        if int(ppid) == pid and state not in ("Z", "X"):
            found[int(entry.name)] = name
    return found


@asynccontextmanager
async def api(port: int) -> AsyncIterator[api_pb2_grpc.APIStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield api_pb2_grpc.APIStub(channel)


async def stop_cleanly(process: ManagedProcess) -> None:
    """SIGTERM: the broker must exit 0 on its own, well before ManagedProcess would resort to SIGKILL."""
    started = time.monotonic()
    code = await process.stop(grace=STOP_WITHIN)
    assert code == 0, f"exit status {code}\n{process.log_tail()}"
    assert time.monotonic() - started < STOP_WITHIN


async def test_sigterm_stops_everything_and_a_restart_keeps_the_data(tmp_path: Path) -> None:
    port, wire_port = free_ports(2)
    process = serve(tmp_path, "--port", str(port), "--wire-port", str(wire_port))
    try:
        await process.start(serving(port), ready_within=START_WITHIN)
        assert process.pid is not None
        children = children_of(process.pid)
        assert sorted(children.values()) == ["etcd", "nats-server"], children
        assert await tcp_probe("127.0.0.1", wire_port)()

        async with api(port) as stub:
            await create_stream(stub, "kept", partitions=2)
            for value in (b"one", b"two", b"three"):
                await publish(stub, "kept", value, ackPolicy=api_pb2.ALL)
            await publish(stub, "kept", b"other partition", partition=1, ackPolicy=api_pb2.ALL)

        await stop_cleanly(process)
        for pid in children:
            async with asyncio.timeout(BOUND):
                await wait_pid_exit(pid)
            assert not pid_alive(pid)
        assert "SIGTERM received" in process.log_tail()

        await process.start(serving(port), ready_within=START_WITHIN)
        async with api(port) as stub:
            assert values(await read_until_stop(stub, "kept")) == [b"one", b"two", b"three"]
            assert values(await read_until_stop(stub, "kept", partition=1)) == [b"other partition"]
            assert (await publish(stub, "kept", b"four")).ack.offset == 3
        await stop_cleanly(process)
    finally:
        await process.stop()


async def test_sigint_stops_cleanly_too(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    process = serve(tmp_path, "--port", str(port), "--wire-port", "0")
    try:
        await process.start(serving(port), ready_within=START_WITHIN)
        assert process.pid is not None
        children = children_of(process.pid)
        os.kill(process.pid, signal.SIGINT)
        async with asyncio.timeout(STOP_WITHIN):
            assert await process.wait() == 0
        for pid in children:
            async with asyncio.timeout(BOUND):
                await wait_pid_exit(pid)
    finally:
        await process.stop()


async def exits_with_error(process: ManagedProcess) -> str:
    """Run a process that must refuse to start; return its output."""
    try:
        await process.start()
        async with asyncio.timeout(BOUND):
            code = await process.wait()
    finally:
        await process.stop()
    assert code != 0
    return process.log_tail()


async def test_unknown_config_key_is_refused_by_name(tmp_path: Path) -> None:
    config = tmp_path / "tidelog.toml"
    config.write_text("prot = 9393\n", encoding="utf-8")
    output = await exits_with_error(serve(tmp_path, "--config", str(config)))
    assert "'prot'" in output and "did you mean 'port'" in output

    output = await exits_with_error(serve(tmp_path, env=clean_env(TIDELOG_RETENTION_MAX_AGE="1d")))
    assert "TIDELOG_RETENTION_MAX_AGE" in output


async def test_port_from_the_environment_and_the_flag_wins(tmp_path: Path) -> None:
    env_port, flag_port = free_ports(2)
    env = clean_env(TIDELOG_PORT=str(env_port), TIDELOG_WIRE_PORT="0")

    from_env = serve(tmp_path, env=env)
    with_flag = serve(tmp_path, "--port", str(flag_port), env=env)
    try:
        await from_env.start(serving(env_port), ready_within=START_WITHIN)
        async with api(env_port) as stub:
            metadata = await bounded(stub.FetchMetadata(api_pb2.FetchMetadataRequest()))
            assert [b.port for b in metadata.brokers] == [env_port]
        await stop_cleanly(from_env)

        await with_flag.start(serving(flag_port), ready_within=START_WITHIN)
        assert not await tcp_probe("127.0.0.1", env_port)()
        await stop_cleanly(with_flag)
    finally:
        await from_env.stop()
        await with_flag.stop()
