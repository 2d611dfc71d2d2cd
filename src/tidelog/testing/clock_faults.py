"""Nemeses on one broker's wall clock (:mod:`tidelog.testing.clock_skew`): jumps and strobes (issue 23, item 2,
"clock"). They need ``FaultRun(skewed_clocks=True)`` (:func:`needs_skewed_clocks` says so for a list of faults).

- ``clock-jump-one``: one broker's wall clock jumps by ±1 minute to ±1 hour (the sign and size from the plan's
  pick) and stays there until undone, when it jumps back to true time (a second jump, the other way).
- ``clock-strobe-one``: one broker's wall clock flips between +``STROBE_S`` and −``STROBE_S`` every
  ``STROBE_PERIOD_S`` while the fault lasts (Jepsen's strobe: a clock that cannot decide), then true time.

Jumps stay below the fault settings' retention by age (7 days by default): a wall clock moved past it makes
that broker delete its segments by age, a loss the nemesis would report and ``docs/durability.md`` lists as not
survived.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable

from tidelog.testing.clock_skew import SkewedClock
from tidelog.testing.fault_run import FaultRun

__all__ = ["CLOCK_FAULTS", "needs_skewed_clocks"]

Undo = Callable[[], Awaitable[None]]
MIN_JUMP_S = 60.0
MAX_JUMP_S = 3600.0
STROBE_S = 600.0
STROBE_PERIOD_S = 0.1


def needs_skewed_clocks(faults: Iterable[str]) -> bool:
    return any(fault in CLOCK_FAULTS for fault in faults)


def _victim(run: FaultRun, pick: float) -> tuple[str, SkewedClock]:
    ordered = sorted(run.clocks)
    if not ordered:
        raise RuntimeError("clock faults need FaultRun(skewed_clocks=True)")
    victim = ordered[min(int(pick * len(ordered)), len(ordered) - 1)]
    return victim, run.clocks[victim]


async def clock_jump_one(run: FaultRun, pick: float) -> tuple[str, Undo]:
    victim, clock = _victim(run, pick)
    # pick in [0, 1): which broker is its first digits; the sign and size come from the rest of it
    rest = (pick * len(run.clocks)) % 1.0
    sign = 1 if rest < 0.5 else -1
    seconds = sign * (MIN_JUMP_S + (rest * 2 % 1.0) * (MAX_JUMP_S - MIN_JUMP_S))
    clock.jump(round(seconds, 1))

    async def undo() -> None:
        clock.jump(0)

    return f"{victim} {seconds:+.0f}s", undo


async def clock_strobe_one(run: FaultRun, pick: float) -> tuple[str, Undo]:
    victim, clock = _victim(run, pick)

    async def strobe() -> None:
        sign = 1
        while True:
            clock.jump(sign * STROBE_S)
            sign = -sign
            await asyncio.sleep(STROBE_PERIOD_S)

    task = asyncio.create_task(strobe(), name=f"clock-strobe-{victim}")

    async def undo() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        clock.jump(0)

    return f"{victim} ±{STROBE_S:g}s every {STROBE_PERIOD_S:g}s", undo


CLOCK_FAULTS = {"clock-jump-one": clock_jump_one, "clock-strobe-one": clock_strobe_one}
