"""Wall-clock faults on one broker: its ``time.time()`` jumps or strobes while its monotonic clock goes on (issue
23, item 2, "clock").

How. A broker started with :func:`skew_env` loads a ``sitecustomize`` (from a directory put first on its
``PYTHONPATH``) that calls :func:`install` before anything else runs: ``time.time`` and ``time.time_ns`` then
return the real wall clock plus an offset in seconds, read from a control file that a daemon thread polls every
:data:`POLL_S`. :class:`SkewedClock` (the test's side) writes that file: ``jump(+3600)``, ``jump(0)``. Every
wall-clock reading of the broker's Python code moves — record timestamps, retention by age, the injected
:class:`~tidelog.clock.SystemClock`, timestamps in etcd records — while ``time.monotonic`` (asyncio's timers,
leases, lag) does not, as when NTP steps a clock.

Why not libfaketime (Debian's ``faketime`` 0.9.10): with ``FAKETIME_DONT_FAKE_MONOTONIC=1``, which a wall-clock
fault needs, its ``clock_nanosleep`` wrapper makes CPython's ``time.sleep`` fail with ``EINVAL``, and faking
the monotonic clock too would be a different fault (every timer firing at once, or none). Why not the injected
:class:`~tidelog.clock.Clock` alone: it reaches only the code that takes one, in-process; the broker is a
separate process and several of its parts read ``time`` directly. What this does not move: readings made in C
(gRPC's core, nats-server and etcd, which are other processes anyway) and ``datetime.now()``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

__all__ = ["SKEW_FILE_ENV", "SkewedClock", "install", "skew_env"]

SKEW_FILE_ENV = "CLOCK_SKEW_FILE"  # not TIDELOG_*: the broker refuses unknown settings there
POLL_S = 0.02
_SITECUSTOMIZE = "from tidelog.testing.clock_skew import install\n\ninstall()\n"


def install() -> None:
    """Patch ``time.time``/``time.time_ns`` with the offset of the file named by :data:`SKEW_FILE_ENV` (no-op
    without it). Runs in the broker, from its ``sitecustomize``."""
    path = os.environ.get(SKEW_FILE_ENV)
    if not path:
        return
    real_time, real_time_ns = time.time, time.time_ns
    offset = [0]  # nanoseconds

    def read() -> None:
        with contextlib.suppress(OSError, ValueError):  # being replaced: keep the last offset
            offset[0] = int(float(Path(path).read_text().strip() or "0") * 1e9)

    def poll() -> None:
        while True:
            read()
            time.sleep(POLL_S)

    read()

    def skewed_time() -> float:
        return real_time() + offset[0] / 1e9

    def skewed_time_ns() -> int:
        return real_time_ns() + offset[0]

    time.time = skewed_time
    time.time_ns = skewed_time_ns
    threading.Thread(target=poll, daemon=True, name="clock-skew").start()


def skew_env(directory: Path, pythonpath: str | None) -> dict[str, str]:
    """Environment variables that make a Python process skewable through ``directory/clock-skew`` (made, at 0):
    a ``sitecustomize`` there, first on ``PYTHONPATH`` (``pythonpath``, the process's own, after it)."""
    hook = directory / "clock-hook"
    hook.mkdir(parents=True, exist_ok=True)
    (hook / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    control = directory / "clock-skew"
    control.write_text("0\n")
    path = str(hook) if not pythonpath else f"{hook}{os.pathsep}{pythonpath}"
    return {"PYTHONPATH": path, SKEW_FILE_ENV: str(control)}


class SkewedClock:
    """The test's side: set the skew of the process started with :func:`skew_env` on ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.control = directory / "clock-skew"
        self.offset = 0.0

    def jump(self, seconds: float) -> None:
        """From now on the process's wall clock reads ``seconds`` off the real one (0: back to true time)."""
        temporary = self.control.with_suffix(".tmp")
        temporary.write_text(f"{seconds!r}\n")
        temporary.replace(self.control)  # the poller never reads half a number
        self.offset = seconds
