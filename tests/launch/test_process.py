"""ManagedProcess: readiness, stop by PID (SIGTERM then SIGKILL), start-up failures, and no orphaned children.

The children are small Python programs, so these tests need nothing but the interpreter. Every wait is bounded by
``asyncio.timeout``; none relies on a fixed sleep.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import BOUND
from tidelog.launch.ports import free_port
from tidelog.launch.probes import all_of, http_get, http_probe, tcp_probe
from tidelog.launch.process import ManagedProcess, ProcessStartError, ProcessState, pid_alive, wait_pid_exit

# Listens on argv[1]; with argv[2] == "ignore-term" it ignores SIGTERM first, so only SIGKILL ends it.
LISTENER = textwrap.dedent(
    """
    import signal, socket, sys
    if sys.argv[2] == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    server = socket.socket()
    server.bind(("127.0.0.1", int(sys.argv[1])))
    server.listen()
    print("listening on", sys.argv[1], flush=True)
    print("a line on stderr", file=sys.stderr, flush=True)
    while True:
        signal.pause()
    """
)


def listener(tmp_path: Path, port: int, mode: str = "normal") -> ManagedProcess:
    return ManagedProcess(
        [sys.executable, "-c", LISTENER, str(port), mode], log_path=tmp_path / "logs" / "listener.log", name="listener"
    )


async def assert_gone(pid: int) -> None:
    async with asyncio.timeout(BOUND):
        await wait_pid_exit(pid)
    assert not pid_alive(pid)


async def test_start_waits_for_readiness_and_stop_terminates(tmp_path: Path) -> None:
    port = free_port()
    process = listener(tmp_path, port)
    assert process.state is ProcessState.NEW
    await process.start(tcp_probe("127.0.0.1", port), ready_within=BOUND)
    assert process.state is ProcessState.RUNNING and process.running
    assert await tcp_probe("127.0.0.1", port)()
    pid = process.pid
    assert pid is not None and pid_alive(pid)

    assert await process.stop(grace=BOUND) == -signal.SIGTERM
    assert process.state is ProcessState.STOPPED and not process.running
    await assert_gone(pid)
    log = (tmp_path / "logs" / "listener.log").read_text()
    assert f"listening on {port}" in log and "a line on stderr" in log  # stdout and stderr both captured


async def test_stop_is_idempotent_and_safe_concurrently(tmp_path: Path) -> None:
    port = free_port()
    process = listener(tmp_path, port)
    assert await process.stop() is None  # never started: nothing to do
    await process.start(tcp_probe("127.0.0.1", port), ready_within=BOUND)
    first, second = await asyncio.gather(process.stop(), process.stop())
    assert first == second == -signal.SIGTERM
    assert await process.stop() == -signal.SIGTERM
    assert process.stop_sync() == -signal.SIGTERM


async def test_stop_kills_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    port = free_port()
    process = listener(tmp_path, port, "ignore-term")
    await process.start(tcp_probe("127.0.0.1", port), ready_within=BOUND)
    assert await process.stop(grace=0.2) == -signal.SIGKILL
    assert process.pid is not None
    await assert_gone(process.pid)


async def test_restart_appends_to_the_log(tmp_path: Path) -> None:
    port = free_port()
    process = listener(tmp_path, port)
    async with process:
        await process.start(tcp_probe("127.0.0.1", port), ready_within=BOUND)
        first_pid = process.pid
        with pytest.raises(RuntimeError, match="already running"):
            await process.start()
        await process.stop()
        await process.start(tcp_probe("127.0.0.1", port), ready_within=BOUND)
        assert process.pid != first_pid
        assert process.log_tail().count(f"listening on {port}") == 1  # only the current run
    assert process.state is ProcessState.STOPPED
    assert (tmp_path / "logs" / "listener.log").read_text().count(f"listening on {port}") == 2


async def test_exit_during_startup_fails_at_once_with_the_log(tmp_path: Path) -> None:
    script = "import sys; print('bad flag --frobnicate', file=sys.stderr); sys.exit(3)"
    process = ManagedProcess([sys.executable, "-c", script], log_path=tmp_path / "crash.log")
    never_ready = tcp_probe("127.0.0.1", free_port())
    async with asyncio.timeout(BOUND):  # far below the readiness deadline: the exit ends the wait
        with pytest.raises(ProcessStartError) as caught:
            await process.start(never_ready, ready_within=600)
    error = caught.value
    assert error.returncode == 3
    assert "exited with status 3" in str(error)
    assert "bad flag --frobnicate" in error.log_tail and "bad flag --frobnicate" in str(error)
    assert process.state is ProcessState.STOPPED


async def test_not_ready_before_the_deadline_stops_the_child(tmp_path: Path) -> None:
    process = listener(tmp_path, free_port())
    with pytest.raises(ProcessStartError, match=r"not ready after 0\.5s"):
        await process.start(tcp_probe("127.0.0.1", free_port()), ready_within=0.5)
    assert process.pid is not None and not process.running
    await assert_gone(process.pid)


async def test_missing_program_is_a_start_error(tmp_path: Path) -> None:
    process = ManagedProcess([str(tmp_path / "no-such-server")], log_path=tmp_path / "x.log")
    with pytest.raises(ProcessStartError, match="cannot execute"):
        await process.start()
    assert process.pid is None


async def test_http_probe_and_all_of(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "health").write_text('{"health":"true"}')
    server = ManagedProcess(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(tmp_path), str(port)],
        log_path=tmp_path / "http.log",
    )
    url = f"http://127.0.0.1:{port}/health"
    async with server:
        await server.start(all_of(tcp_probe("127.0.0.1", port), http_probe(url)), ready_within=BOUND)
        async with asyncio.timeout(BOUND):
            assert await http_get(url) == (200, b'{"health":"true"}')
            assert (await http_get(f"http://127.0.0.1:{port}/missing"))[0] == 404
            assert await http_probe(url, body_contains=b'"health":"true"')()
            assert not await http_probe(url, body_contains=b"nope")()
            assert not await http_probe(f"http://127.0.0.1:{port}/missing")()
    assert not await http_probe(url)()  # server gone: "not ready", not an exception


# ---- children never outlive the parent ----

PARENT = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from pathlib import Path
    from tidelog.launch.process import ManagedProcess

    async def main():
        log, die_with_parent = Path(sys.argv[1]), sys.argv[2] == "pdeathsig"
        child = ManagedProcess(
            [sys.executable, "-c", "import signal; signal.pause()"], log_path=log, die_with_parent=die_with_parent
        )
        await child.start()
        print(child.pid, flush=True)
        if sys.argv[3] == "die-at-once":  # the earliest moment: the instant the child is reported started
            os.kill(os.getpid(), signal.SIGKILL)
        return child

    child = asyncio.run(main())
    if sys.argv[3] == "wait":
        sys.stdin.read()  # until the test kills us
    """
)


def popen_parent(tmp_path: Path, mode: str, then: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "child.log"), mode, then],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


async def spawn_parent(tmp_path: Path, mode: str, then: str) -> tuple[subprocess.Popen[str], int]:
    parent = popen_parent(tmp_path, mode, then)
    assert parent.stdout is not None
    async with asyncio.timeout(BOUND):  # the parent prints as soon as the child is spawned
        line = await asyncio.to_thread(parent.stdout.readline)
    assert line.strip().isdigit(), f"parent printed {line!r}"
    return parent, int(line)


@pytest.mark.slow
async def test_exit_hook_stops_children_of_a_parent_that_exits(tmp_path: Path) -> None:
    parent, child_pid = await spawn_parent(tmp_path, "no-pdeathsig", "exit")  # only the atexit hook can save us
    try:
        async with asyncio.timeout(BOUND):
            assert await asyncio.to_thread(parent.wait) == 0
        await assert_gone(child_pid)
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.slow
async def test_children_die_with_a_parent_killed_by_sigkill(tmp_path: Path) -> None:
    parent, child_pid = await spawn_parent(tmp_path, "pdeathsig", "wait")
    assert pid_alive(child_pid)
    parent.kill()  # no Python code runs in the parent: only the kernel's parent-death signal can act
    parent.wait()
    await assert_gone(child_pid)


RACE_ROUNDS = 12


@pytest.mark.slow
async def test_children_die_with_a_parent_killed_the_moment_they_are_started(tmp_path: Path) -> None:
    """The death signal is armed before a child is reported started: a parent that dies at once still takes it
    along (before, ``setpriv`` armed it only after the parent was gone, against the new parent, and it lived)."""
    survivors = []
    for round_ in range(RACE_ROUNDS):
        parent, child_pid = await spawn_parent(tmp_path / str(round_), "pdeathsig", "die-at-once")
        assert await asyncio.to_thread(parent.wait, BOUND) == -signal.SIGKILL
        try:
            async with asyncio.timeout(5.0):
                await wait_pid_exit(child_pid)
        except TimeoutError:
            survivors.append(child_pid)
            os.kill(child_pid, signal.SIGKILL)
    assert not survivors, f"{len(survivors)} of {RACE_ROUNDS} children outlived their SIGKILLed parent"


async def test_garbage_collected_process_takes_its_child_along(tmp_path: Path) -> None:
    port = free_port()
    process = listener(tmp_path, port)
    await process.start(tcp_probe("127.0.0.1", port), ready_within=BOUND)
    pid = process.pid
    assert pid is not None
    with pytest.warns(ResourceWarning, match="still running"):
        del process
        gc.collect()
    await assert_gone(pid)


def test_pid_alive_counts_a_zombie_as_gone() -> None:
    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # blocks until it exits, leaving it unreaped
    assert not pid_alive(child.pid)  # a zombie: exited, not yet reaped
    child.wait()
    assert not pid_alive(child.pid)
