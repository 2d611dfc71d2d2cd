"""``tidelog serve`` when things are not as they should be: NATS or etcd unreachable, a port taken, a signal at an
awkward moment. Real ``tidelog serve`` processes on free loopback ports, stopped by PID.

What an operator must get: a failure to reach a dependency logged once per change of state (naming the address
and what the broker does next), no traceback flood; SIGTERM ends the process in every state, start-up included;
a taken port is one line naming the port, the server and the setting that moves it.
"""

from __future__ import annotations

import asyncio
import re
import resource
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import BOUND, LONG_BOUND
from tidelog.broker.embedded import EmbeddedEtcd, EmbeddedNats
from tidelog.launch.ports import free_ports
from tidelog.launch.probes import tcp_probe
from tidelog.launch.process import ManagedProcess
from tidelog.local.serve_process import TIDELOG, clean_env, serving

pytestmark = pytest.mark.slow

STOP_WITHIN = 20.0  # a broker that never finished starting has little to stop
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def serve(workdir: Path, *args: str, name: str = "serve") -> ManagedProcess:
    return ManagedProcess(
        [TIDELOG, "serve", "--data-dir", workdir / "data", *args],
        log_path=workdir / f"{name}.log",
        name="tidelog-serve",
        env=clean_env(TIDELOG_EMBEDDED_NATS_PORT="0", TIDELOG_HTTP_PORT="0"),
    )


async def wait_for_output(process: ManagedProcess, pattern: str, *, count: int = 1, within: float = BOUND) -> str:
    """Wait until the process's output holds ``pattern`` ``count`` times; its output then."""
    async with asyncio.timeout(within):
        while True:
            output = process.log_tail(max_lines=10_000, max_bytes=1 << 20)
            if len(re.findall(pattern, output)) >= count:
                return output
            assert process.running, f"exited with {process.returncode}:\n{output}"
            await asyncio.sleep(0.05)


async def sigterm_ends_it(process: ManagedProcess) -> str:
    """SIGTERM: the process must exit 0 on its own within :data:`STOP_WITHIN`; its output."""
    process.signal(signal.SIGTERM)
    async with asyncio.timeout(STOP_WITHIN):
        code = await process.wait()
    output = process.log_tail(max_lines=10_000, max_bytes=1 << 20)
    assert code == 0, f"exit status {code}\n{output}"
    return output


def records(output: str) -> list[str]:
    """The output's log records, each with its continuation lines (a traceback, say)."""
    found: list[str] = []
    for line in output.splitlines():
        if LOG_LINE.match(line) or not found:
            found.append(line)
        else:
            found[-1] += "\n" + line
    return found


def logged(output: str, level: str = "") -> list[str]:
    """The records above DEBUG (at ``level`` if given)."""
    above = [r for r in records(output) if (m := LOG_LINE.match(r)) is None or m.group(1) != "DEBUG"]
    return [r for r in above if f" {level} " in r] if level else above


@pytest.fixture
def closed_ports() -> tuple[int, int]:
    nats_port, etcd_port = free_ports(2)
    return nats_port, etcd_port


# ---- a dependency that does not answer ----


async def test_unreachable_nats_and_etcd_log_once_and_sigterm_ends_start_up(
    tmp_path: Path, closed_ports: tuple[int, int]
) -> None:
    nats_port, etcd_port = closed_ports
    args = (
        "--port=0",
        "--wire-port=0",
        f"--nats-servers=nats://127.0.0.1:{nats_port}",
        f"--etcd-endpoints=http://127.0.0.1:{etcd_port}",
    )
    process = serve(tmp_path, *args, "--log-level=debug")
    try:
        await process.start()
        # Several rounds of the back-off (each later attempt is a DEBUG line), then SIGTERM.
        await wait_for_output(process, "NATS at .* still unreachable", count=4, within=LONG_BOUND)
        output = await sigterm_ends_it(process)
    finally:
        await process.stop()
    above_debug = logged(output)
    warnings = logged(output, "WARNING")
    assert len(warnings) == 1, "\n".join(above_debug)
    assert f"NATS at nats://127.0.0.1:{nats_port} is unreachable (connection refused)" in warnings[0]
    assert "retrying with back-off up to 5s" in warnings[0]
    assert "SIGTERM received" in output and "stopped" in above_debug[-1]
    assert "Traceback" not in "\n".join(above_debug)

    # SIGTERM at once, while the interpreter is still starting, and right after the first failure.
    at_once = serve(tmp_path, *args, name="at-once")
    try:
        await at_once.start()
        at_once.signal(signal.SIGTERM)
        async with asyncio.timeout(STOP_WITHIN):
            assert await at_once.wait() in (0, -signal.SIGTERM)
    finally:
        await at_once.stop()
    first_failure = serve(tmp_path, *args, name="first-failure")
    try:
        await first_failure.start()
        await wait_for_output(first_failure, "NATS at .* is unreachable", within=LONG_BOUND)
        output = await sigterm_ends_it(first_failure)
    finally:
        await first_failure.stop()
    assert len(logged(output)) <= 4, output
    assert "Traceback" not in output


async def test_unreachable_etcd_alone_logs_once_and_sigterm_ends_start_up(
    tmp_path: Path, closed_ports: tuple[int, int]
) -> None:
    _, etcd_port = closed_ports
    async with EmbeddedNats(tmp_path / "nats") as nats_server:
        process = serve(
            tmp_path, "--port=0", "--wire-port=0", f"--nats-servers={nats_server.url}",
            f"--etcd-endpoints=http://127.0.0.1:{etcd_port}", "--log-level=debug",
        )  # fmt: skip
        try:
            await process.start()
            await wait_for_output(process, "etcd at .* still unreachable", count=3, within=LONG_BOUND)
            output = await sigterm_ends_it(process)
        finally:
            await process.stop()
    warnings = logged(output, "WARNING")
    assert len(warnings) == 1, "\n".join(warnings)
    assert f"etcd at http://127.0.0.1:{etcd_port} is unreachable" in warnings[0]
    assert "Traceback" not in "\n".join(logged(output))


async def test_nats_and_etcd_lost_while_running_log_once_and_sigterm_still_ends_it(tmp_path: Path) -> None:
    nats_server = EmbeddedNats(tmp_path / "nats")
    etcd_server = EmbeddedEtcd(tmp_path / "etcd")
    await asyncio.gather(nats_server.start(), etcd_server.start())
    (port,) = free_ports(1)
    process = serve(
        tmp_path, f"--port={port}", "--wire-port=0", f"--nats-servers={nats_server.url}",
        f"--etcd-endpoints={etcd_server.client_url}", "--log-level=debug",
    )  # fmt: skip
    try:
        await process.start(serving(port), ready_within=LONG_BOUND)
        await asyncio.gather(nats_server.stop(), etcd_server.stop())
        await wait_for_output(process, "NATS at .* is unreachable", within=LONG_BOUND)
        # Several failed lease refreshes and election attempts (each a DEBUG line after the first), then SIGTERM.
        await wait_for_output(process, "etcd at .* still unreachable", count=6, within=LONG_BOUND)
        lost_at = len(records(process.log_tail(max_lines=10_000, max_bytes=1 << 20)))
        output = await sigterm_ends_it(process)
    finally:
        await process.stop()
        await asyncio.gather(nats_server.stop(), etcd_server.stop())
    while_lost = [r for r in records(output)[lost_at - 1 :] if r in logged(output)]
    assert "Traceback" not in "\n".join(logged(output)), "\n".join(while_lost)
    unreachable = [r for r in logged(output, "WARNING") if "unreachable" in r]
    assert 2 <= len(unreachable) <= 6, "\n".join(unreachable)  # NATS once; etcd once per component, per reason
    assert any(f"etcd at 127.0.0.1:{etcd_server.client_port} is unreachable" in r for r in unreachable)


# ---- ports taken ----


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another process listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


async def refused(process: ManagedProcess) -> str:
    """Run a ``serve`` that must refuse to start; its output."""
    try:
        await process.start()
        async with asyncio.timeout(LONG_BOUND):
            code = await process.wait()
    finally:
        await process.stop()
    output = process.log_tail()
    assert code == 1, output
    return output


@pytest.mark.parametrize(
    ("flag", "what", "setting"),
    [
        ("--embedded-nats-port", "the embedded nats-server", "TIDELOG_EMBEDDED_NATS_PORT"),
        ("--wire-port", "the tidelog wire protocol", "TIDELOG_WIRE_PORT"),
        ("--port", "the Liftbridge gRPC API", "TIDELOG_PORT"),
        ("--http-port", "the HTTP port (/metrics, /healthz, /readyz)", "TIDELOG_HTTP_PORT"),
    ],
)
async def test_a_taken_port_is_one_line_naming_it_and_its_setting(
    tmp_path: Path, taken_port: int, flag: str, what: str, setting: str
) -> None:
    ports = {"--port": "0", "--wire-port": "0", "--http-port": "0", "--embedded-nats-port": "0", flag: str(taken_port)}
    output = await refused(serve(tmp_path, *(f"{key}={value}" for key, value in ports.items())))
    assert "Traceback" not in output
    (line,) = output.strip().splitlines()
    assert line.startswith("Error: cannot start the broker: ")
    assert f"{what} cannot listen on 127.0.0.1:{taken_port}" in line
    assert f"{flag} PORT" in line and setting in line


async def test_more_connections_than_the_open_file_limit_allows_is_one_line_naming_the_setting(
    tmp_path: Path,
) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard limit on open files here")
    output = await refused(serve(tmp_path, "--port=0", "--wire-port=0", "-s", f"wire_max_connections={hard}"))
    assert "Traceback" not in output
    (line,) = output.strip().splitlines()
    assert line.startswith("Error: wire_max_connections allows ")
    assert f"may open at most {hard} (ulimit -Hn)" in line


async def test_a_start_that_failed_on_a_taken_nats_port_leaves_a_usable_data_directory(
    tmp_path: Path, taken_port: int
) -> None:
    """The first start fails (its embedded NATS port is taken) while its etcd is starting beside it; the next start
    on the same data directory, with a free port, must come up."""
    for attempt in range(3):  # the etcd beside it is at a different point of its start-up each time
        workdir = tmp_path / str(attempt)
        output = await refused(serve(workdir, "--port=0", "--wire-port=0", f"--embedded-nats-port={taken_port}"))
        assert "embedded nats-server" in output
        (port,) = free_ports(1)
        again = serve(workdir, f"--port={port}", "--wire-port=0", "--embedded-nats-port=0", name="again")
        try:
            await again.start(serving(port), ready_within=LONG_BOUND)
            again.signal(signal.SIGTERM)
            async with asyncio.timeout(STOP_WITHIN):
                assert await again.wait() == 0
        finally:
            await again.stop()


def test_serve_help_shows_the_embedded_ports() -> None:
    from click.testing import CliRunner

    from tidelog.cli.main import cli

    result = CliRunner().invoke(cli, ["serve", "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0
    assert "--embedded-nats-port" in result.output and "TIDELOG_EMBEDDED_NATS_PORT" in result.output
    assert "--embedded-etcd-port" in result.output


# ---- the endpoints file ----


async def cli(workdir: Path, *args: str) -> tuple[int, str]:
    """Run a ``tidelog`` client command in ``workdir`` without any TIDELOG_* variable; exit status and output."""
    child = await asyncio.create_subprocess_exec(
        str(TIDELOG), *args, cwd=workdir, env=clean_env(), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    async with asyncio.timeout(LONG_BOUND):
        output, _ = await child.communicate()
    assert child.returncode is not None
    return child.returncode, output.decode()


async def test_the_cli_finds_a_local_broker_through_its_endpoints_file(tmp_path: Path) -> None:
    """As after ``make run``: ``tidelog serve`` with its default data directory, then client commands without
    flags in the same directory, including ``cluster status`` (whose etcd port is chosen at random)."""
    (port,) = free_ports(1)
    process = ManagedProcess(
        [TIDELOG, "serve", f"--port={port}", "--wire-port=0", "--embedded-nats-port=0"],
        log_path=tmp_path / "serve.log",
        name="tidelog-serve",
        env=clean_env(),
        cwd=tmp_path,
    )
    endpoints = tmp_path / "tidelog-data" / "endpoints.json"
    try:
        await process.start(serving(port), ready_within=LONG_BOUND)
        assert f"127.0.0.1:{port}" in endpoints.read_text()

        code, output = await cli(tmp_path, "cluster", "status", "--wide")
        assert code == 0, output
        broker_id = (tmp_path / "tidelog-data" / "broker-id").read_text().strip()
        assert broker_id in output
        code, output = await cli(tmp_path, "stream", "create", "found")
        assert code == 0, output
        code, output = await cli(tmp_path, "stream", "list")
        assert code == 0 and "found" in output, output

        code, output = await cli(tmp_path, "stream", "list", "-b", f"127.0.0.1:{free_ports(1)[0]}")
        assert code != 0, output  # an explicit address wins over the file
        code, output = await cli(tmp_path, "cluster", "status", "--data-dir", str(tmp_path / "elsewhere"))
        assert code != 0 and "no etcd endpoints" in output, output

        output = await sigterm_ends_it(process)
    finally:
        await process.stop()
    assert not endpoints.exists(), "a clean stop removes the file"


async def test_any_setting_is_taken_with_dash_s_and_the_named_flags_win(tmp_path: Path) -> None:
    shadowed, port = free_ports(2)
    process = serve(
        tmp_path, "-s", f"port={shadowed}", f"--port={port}", "-s", "wire_port=0", "-s", "cleaner_interval_ms=500"
    )
    try:
        await process.start(serving(port), ready_within=LONG_BOUND)
        assert not await tcp_probe("127.0.0.1", shadowed)()
        output = await sigterm_ends_it(process)
    finally:
        await process.stop()
    assert "Traceback" not in output

    unknown = serve(tmp_path, "-s", "retention_max_age=1d")
    try:
        await unknown.start()
        async with asyncio.timeout(LONG_BOUND):
            code = await unknown.wait()
    finally:
        await unknown.stop()
    output = unknown.log_tail()
    assert code == 2, output  # a usage error, like any bad option
    assert "unknown setting 'retention_max_age' (did you mean retention_max_age_ms?)" in output
    assert "Traceback" not in output
