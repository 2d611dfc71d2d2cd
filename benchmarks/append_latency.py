"""Append latency benchmark: one ``Log.append`` at a time with flush ``always`` (each waits for its fsync).

    python -m benchmarks.append_latency [--quick] [--contend N] [--gap-us US | --tight] [--loop uvloop|asyncio]

What the publish benchmark's ``latency_p50_fsync`` spends inside the storage engine, without the network: a
single appender awaits each 1 KiB single-record batch (flush ``always``) before sending the next, on the event
loop the broker uses (uvloop). Between two appends (untimed) the appender sends one byte to a child process that
answers after ``--gap-us`` (default 100 µs), so the loop goes idle as it does while a remote client's ack and
its next publish travel. ``--tight`` appends back to back instead: the loop never idles, and the flusher then
keeps most fsyncs on its worker thread (see :mod:`tidelog.storage.flush`). The peer is the same bytes written
to one file with ``os.pwrite`` and ``os.fdatasync`` inline (no event loop, no thread): the floor for this disk.

It also measures group commit: ``concurrent_appends_per_fsync`` runs 64 appenders at once and reports how many
appends each fsync covered (higher is better; it must stay well above 1).

``--contend N`` starts ``N`` busy-looping processes for the duration (CPU contention, as on a shared machine).
Each measurement is repeated (3 times, 2 with ``--quick``) with the sides alternating; medians are reported as
one JSON object per line (the output contract of ``benchmarks/_common.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import Row, RunClock, Target, log, median, report, scratch_dir
from tidelog.protocol.records import NewRecord, build_batch
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.log import Log

BENCH = "append_latency"
VALUE_SIZE = 1024
CONCURRENT_APPENDERS = 64
GAP_US = 100.0  # about a remote client's share of one publish's round trip here (with time.sleep's slack: ~160 µs)
TARGETS = (Target("append_1k_always_p50", "<=", 1.3),)  # what the log adds to write + fdatasync: under 30 %


def _percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def _batches(count: int) -> list[bytes]:
    return [build_batch([NewRecord(os.urandom(VALUE_SIZE))], timestamp=time.time_ns()) for _ in range(count)]


_ECHO = """
import os, sys, time
delay = float(sys.argv[1])
while data := os.read(0, 64):
    if delay:
        time.sleep(delay)
    os.write(1, data)
"""


class _Echo:
    """A byte's round trip through a child process that answers after ``delay`` seconds: between two appends
    the loop goes idle, as it does while one client's ack and its next publish travel (``--gap-us``). Raw pipes
    and one reader callback, so that the round trip costs the loop a few µs of CPU, as a remote client's would
    cost it none."""

    def __init__(self, delay: float) -> None:
        argv = [sys.executable, "-c", _ECHO, str(delay)]
        self._process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        assert self._process.stdin is not None and self._process.stdout is not None
        self._to = self._process.stdin.fileno()
        self._from = self._process.stdout.fileno()
        self._loop = asyncio.get_running_loop()
        self._waiting: asyncio.Future[None] | None = None
        self._loop.add_reader(self._from, self._on_readable)

    def _on_readable(self) -> None:
        os.read(self._from, 64)
        if self._waiting is not None and not self._waiting.done():
            self._waiting.set_result(None)

    async def ping(self) -> None:
        self._waiting = self._loop.create_future()
        os.write(self._to, b"x")
        await self._waiting

    def close(self) -> None:
        self._loop.remove_reader(self._from)
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.close()
        self._process.wait()
        self._process.stdout.close()


async def _log_latencies(directory: Path, batches: Sequence[bytes], warmup: int, gap: float | None) -> list[float]:
    log_ = await Log.open_async(directory, LogConfig(flush_policy=FlushPolicy.ALWAYS))
    echo = _Echo(gap) if gap is not None else None
    out: list[float] = []
    try:
        for i, data in enumerate(batches):
            if echo is not None:
                await echo.ping()
            started = time.perf_counter_ns()
            await log_.append(data, 1)
            if i >= warmup:
                out.append((time.perf_counter_ns() - started) / 1000)
    finally:
        if echo is not None:
            echo.close()
        await log_.close()
    flusher = log_.flusher
    log(f"  {getattr(flusher, 'inline_rounds', 0)} of {flusher.fsync_rounds} fsync rounds inline")
    return out


def _raw_latencies(path: Path, batches: Sequence[bytes], warmup: int) -> list[float]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    out: list[float] = []
    position = 0
    try:
        for i, data in enumerate(batches):
            started = time.perf_counter_ns()
            position += os.pwrite(fd, data, position)
            os.fdatasync(fd)
            if i >= warmup:
                out.append((time.perf_counter_ns() - started) / 1000)
    finally:
        os.close(fd)
    return out


async def _appends_per_fsync(directory: Path, batches: Sequence[bytes]) -> float:
    log_ = await Log.open_async(directory, LogConfig(flush_policy=FlushPolicy.ALWAYS))
    try:
        queue = list(batches)

        async def appender() -> None:
            while queue:
                await log_.append(queue.pop(), 1)

        await asyncio.gather(*(appender() for _ in range(CONCURRENT_APPENDERS)))
        return len(batches) / max(1, log_.flusher.fsync_rounds)
    finally:
        await log_.close()


def _spin() -> None:  # pragma: no cover - runs in a child process until terminated
    while True:
        pass


@contextlib.contextmanager
def _contention(processes: int) -> Iterator[None]:
    children = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(processes)]
    for child in children:
        child.start()
    try:
        yield
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.join()


def _run(kind: str, main: Coroutine[Any, Any, Any]) -> Any:
    if kind == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and appends")
    parser.add_argument("--contend", type=int, default=0, help="busy-looping processes to run meanwhile")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument(
        "--gap-us",
        type=float,
        default=GAP_US,
        help="how long the echo child waits before answering (default %(default)s)",
    )
    parser.add_argument(
        "--tight", action="store_true", help="append back to back, never letting the loop go idle in between"
    )
    args = parser.parse_args(argv)
    reps = 2 if args.quick else 3
    gap = None if args.tight else args.gap_us / 1e6
    samples, warmup = (1000, 100) if args.quick else (3000, 200)
    batches = _batches(samples + warmup)
    ours: dict[str, list[float]] = {"p50": [], "p90": [], "p99": []}
    raw: dict[str, list[float]] = {"p50": [], "p90": [], "p99": []}
    shares: list[float] = []
    clock = RunClock.now()
    with scratch_dir("tidelog-bench-append-latency-") as scratch, _contention(args.contend):
        for rep in range(reps):
            order = ("log", "raw") if rep % 2 == 0 else ("raw", "log")
            for side in order:
                os.sync()
                if side == "log":
                    lat = _run(args.loop, _log_latencies(scratch / f"log-{rep}", batches, warmup, gap))
                    into = ours
                else:
                    lat = _raw_latencies(scratch / f"raw-{rep}", batches, warmup)
                    into = raw
                for q in into:
                    into[q].append(_percentile(lat, float(q[1:])))
                log(f"rep {rep} {side}: p50 {into['p50'][-1]:.0f} µs, p99 {into['p99'][-1]:.0f} µs")
            share = _run(args.loop, _appends_per_fsync(scratch / f"group-{rep}", batches))
            shares.append(share)
            log(f"rep {rep} group commit: {share:.1f} appends per fsync")
    rows = [Row(BENCH, f"append_1k_always_{q}", median(ours[q]), "µs", median(raw[q])) for q in ours]
    rows.append(Row(BENCH, "concurrent_appends_per_fsync", median(shares), "appends"))
    report(
        BENCH,
        rows,
        TARGETS,
        clock,
        loop=args.loop,
        contend=args.contend,
        between_appends="nothing" if args.tight else f"a round trip through a child answering after {args.gap_us:g} µs",
        samples=samples,
        runs=reps,
    )


if __name__ == "__main__":
    main()
