"""The broker's side of its API fronts: start them, restart one that dies, stop them with the broker.

:meth:`ApiFronts.start` starts every front and waits until each listens (its ``ready`` line), so a broker whose
fronts cannot start does not start either, with the front's own error in the log. A front that exits while the
broker runs is reported (a warning naming it and how it ended) and started again after a pause that doubles up to
:data:`MAX_RESTART_DELAY` while it keeps failing. :meth:`ApiFronts.stop` sends SIGTERM to each front by its pid and
waits; one still running after the grace gets SIGKILL. A front also ends by itself when its standard input (a pipe
from the broker) closes: a broker killed outright leaves no front behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys

from tidelog.api.front.process import READY, FrontSettings, write_settings

log = logging.getLogger(__name__)

READY_TIMEOUT = 30.0
"""Seconds a front may take to listen."""

FIRST_RESTART_DELAY = 0.5
MAX_RESTART_DELAY = 30.0


class FrontStartError(OSError):
    """A front exited or did not listen in time (an OSError: ``tidelog serve`` reports it in one line)."""


class ApiFronts:
    """``count`` front processes for one broker (module docstring)."""

    def __init__(self, count: int, settings: FrontSettings) -> None:
        self._count = count
        self._settings = settings
        self._processes: dict[int, asyncio.subprocess.Process] = {}
        self._watchers: list[asyncio.Task[None]] = []
        self._stopping = False
        self.restarts = 0

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self._processes.values()]

    async def start(self) -> None:
        started = await asyncio.gather(*(self._spawn(index) for index in range(self._count)), return_exceptions=True)
        failed = [each for each in started if isinstance(each, BaseException)]
        if failed:
            await self.stop()
            raise failed[0]
        for index in range(self._count):
            self._watchers.append(asyncio.create_task(self._watch(index), name=f"api-front-{index}"))

    async def _spawn(self, index: int) -> None:
        settings = FrontSettings(
            self._settings.config,
            index,
            self._settings.port,
            self._settings.broker_port,
            self._settings.nats_urls,
            self._settings.etcd_endpoints,
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tidelog.api.front",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        self._processes[index] = process
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(write_settings(settings))
        await process.stdin.drain()  # the pipe stays open: its end tells the front the broker is gone
        try:
            async with asyncio.timeout(READY_TIMEOUT):
                line = await process.stdout.readline()
        except TimeoutError:
            line = b""
        if line != READY:
            await _end(process, 1.0)
            raise FrontStartError(
                f"API front {index} did not start (exit status {process.returncode}; its error is in the log above)"
            )
        log.info("API front %d (pid %d) serves gRPC on port %d", index, process.pid, settings.port)

    async def _watch(self, index: int) -> None:
        """Restart front ``index`` whenever it exits while the broker runs."""
        delay = FIRST_RESTART_DELAY
        while not self._stopping:
            process = self._processes.get(index)
            if process is not None:
                status = await process.wait()
                if self._stopping:
                    return
                log.warning(
                    "API front %d (pid %d) exited with status %s; starting it again", index, process.pid, status
                )
            await asyncio.sleep(delay)
            if self._stopping:
                return
            try:
                await self._spawn(index)
                self.restarts += 1
                delay = FIRST_RESTART_DELAY
            except OSError as exc:
                self._processes.pop(index, None)
                log.error("API front %d could not be started again: %s", index, exc)
                delay = min(MAX_RESTART_DELAY, delay * 2)

    async def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every front, SIGKILL those still running after ``grace``; safe to call more than once."""
        self._stopping = True
        for watcher in self._watchers:
            watcher.cancel()
        for watcher in self._watchers:
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        self._watchers.clear()
        await asyncio.gather(*(_end(process, grace) for process in self._processes.values()))
        self._processes.clear()


async def _end(process: asyncio.subprocess.Process, grace: float) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            async with asyncio.timeout(grace):
                await process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    if process.stdin is not None:
        process.stdin.close()
