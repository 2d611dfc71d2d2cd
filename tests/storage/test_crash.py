"""Crash safety: SIGKILL an appending process at random moments; nothing it acknowledged may be lost.

The child (:mod:`tidelog.testing.crash_child`) appends with flush policy ``ALWAYS`` from several concurrent
tasks and prints every acknowledged append. After each kill the log is reopened here and checked:

- every reported append is present at its offsets, byte for byte (SHA-256 of the stored batch);
- the log is a clean prefix: offsets dense from 0, every batch passes its CRC (``Log.read`` checks them).

The same directory is reused across rounds, so each round also recovers what the previous kill left, and
every other round the checker itself "crashes" (drops the log without closing it) so the child's own open
goes through unclean recovery too.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tidelog.protocol.records import iter_batches
from tidelog.storage.log import Log
from tidelog.testing.crash_child import CONFIG

from .logutil import read_everything

ROUNDS = 24
TIME_BUDGET_S = 60.0


class LineReader:
    """Reads lines from a child's stdout with a deadline (never blocks past it)."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        self.fd = process.stdout.fileno()
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.fd, selectors.EVENT_READ)
        self.buffer = b""
        self.eof = False
        self.seen: list[bytes] = []  # every line returned so far

    def line(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if self.eof or remaining <= 0 or not self.selector.select(remaining):
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                self.eof = True
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        self.seen.append(line)
        return line

    def drain(self, timeout: float) -> None:
        """Read up to end of file (the child is dead: what it printed before dying is still in the pipe)."""
        while self.line(timeout) is not None:
            pass

    def close(self) -> None:
        self.selector.close()


def _check(log: Log, acknowledged: dict[int, tuple[int, str]]) -> None:
    content = read_everything(log, chunk=1 << 20)  # every batch CRC-checked on the way
    expected_next = 0
    batches: dict[int, tuple[int, str]] = {}
    for position, header in iter_batches(content):
        assert header.base_offset == expected_next, "offsets must be dense from 0"
        expected_next = header.next_offset
        digest = hashlib.sha256(content[position : position + header.size]).hexdigest()
        batches[header.base_offset] = (header.last_offset, digest)
    assert expected_next == log.end_offset
    for base, (last, digest) in acknowledged.items():
        assert batches.get(base) == (last, digest), f"acknowledged append at offset {base} lost or changed"


@pytest.mark.slow
def test_sigkill_never_loses_an_acknowledged_append(tmp_path: Path) -> None:
    rng = random.Random(20240611)
    acknowledged: dict[int, tuple[int, str]] = {}
    started = time.monotonic()
    rounds = 0
    truncations = 0
    while rounds < ROUNDS and time.monotonic() - started < TIME_BUDGET_S:
        stderr_path = tmp_path / f"child-{rounds}.err"
        with open(stderr_path, "wb") as stderr:
            child = subprocess.Popen(
                [sys.executable, "-m", "tidelog.testing.crash_child", str(tmp_path / "log"), str(rounds)],
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        reader = LineReader(child)
        try:
            ready = reader.line(timeout=30)
            assert ready is not None, stderr_path.read_text()
            assert json.loads(ready)["ready"]
            for _ in range(rng.randint(0, 60)):  # pace the kill: after a random number of acknowledgements
                if reader.line(timeout=30) is None:
                    break
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=30)
        finally:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
                child.wait(timeout=30)
        reader.drain(timeout=5)
        reader.close()
        assert child.stdout is not None
        child.stdout.close()
        assert child.returncode == -signal.SIGKILL, stderr_path.read_text()
        _record(acknowledged, reader.seen)
        rounds += 1
        log = Log.open(tmp_path / "log", CONFIG)
        truncations += log.recovery.truncated_bytes > 0
        _check(log, acknowledged)
        if rounds % 2:
            asyncio.run(log.close())
        else:
            for segment in log._segments:  # the checker "crashes" too: the child must recover uncleanly
                segment.close()
    assert rounds >= 20, f"only {rounds} rounds fitted in the time budget"
    assert len(acknowledged) > rounds  # the child really did acknowledge appends before dying
    segments = len(list((tmp_path / "log").glob("*.log")))
    print(f"rounds={rounds} acknowledged={len(acknowledged)} torn-tail-cuts={truncations} segments={segments}")


def _record(acknowledged: dict[int, tuple[int, str]], lines: list[bytes]) -> None:
    for raw in lines:
        report = json.loads(raw)
        if "base" in report:
            acknowledged[report["base"]] = (report["last"], report["sha256"])
