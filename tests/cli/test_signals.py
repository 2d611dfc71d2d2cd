"""Stopping on SIGTERM or SIGINT: a stop that overruns its bound ends the process anyway. Real child processes."""

from __future__ import annotations

import asyncio
import signal
import sys

import pytest

from tests.helpers import BOUND

CHILD = """
import asyncio, sys, time
from tidelog.cli.signals import stop_on_signals

async def main():
    stop = stop_on_signals(
        lambda name: print("stopping on", name, flush=True),
        exit_within=0.5,
        overdue=lambda bound: print(f"overdue after {bound}s", flush=True),
    )
    print("ready", flush=True)
    await stop.wait()
    if sys.argv[1] == "blocked":
        time.sleep(3600)  # the event loop itself stuck
    await asyncio.Event().wait()  # a stop that never finishes

asyncio.run(main())
"""


@pytest.mark.parametrize("stuck", ["waiting", "blocked"])
async def test_a_stop_that_overruns_ends_the_process(stuck: str) -> None:
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, stuck, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    assert child.stdout is not None
    try:
        async with asyncio.timeout(BOUND):
            assert await child.stdout.readline() == b"ready\n"
            child.send_signal(signal.SIGTERM)
            rest = (await child.stdout.read()).decode()
            assert await child.wait() == 1
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    assert "stopping on SIGTERM" in rest and "overdue after 0.5s" in rest
