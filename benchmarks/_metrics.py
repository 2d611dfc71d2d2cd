"""What the broker's metrics cost, measured inside ``benchmarks.publish`` (same run, same machine state).

- ``metrics_overhead``: 1 KiB produce throughput (the publish benchmark's producer, acks ALL) with
  ``default_flush_policy = "always"`` on a broker with metrics on ÷ the same on a broker started with
  ``metrics_enabled = false``. Target ≥ 0.97: counting requests and fsyncs costs under 3 % of the write rate.
  ``metrics_overhead_nofsync`` (informational) is the same with ``"never"``: no disk in the loop, so it shows the
  CPU the metrics cost without the fsync rounds' noise.
- ``metrics_overhead_cpu_fsync``, ``metrics_overhead_cpu_nofsync`` (informational): the broker process's CPU
  time per message produced (every thread's run time, from ``/proc/<pid>/task/*/schedstat``), metrics on (value)
  and off (peer), same samples. CPU time is what the metrics could cost; unlike the wall-clock rate it moves
  little with the other processes of a shared machine or with how the fsync rounds fall. Its ratio is on ÷ off:
  1.03 would be 3 % more work.
- ``metrics_scrape_1000``: milliseconds of one ``GET /metrics`` of a broker leading a stream of 1,000 partitions
  (median of :data:`SCRAPES`). Its peer value is the 1,000 ms budget, so its ratio ≤ 1 means "answers in under a
  second".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from benchmarks._common import Row, log, median
from tidelog.client import Admin

SCRAPE_PARTITIONS = 1000
SCRAPES = 5
SCRAPE_BUDGET_MS = 1000.0
WIDE_STREAM = "wide"
OVERHEAD_MODES = {"metrics_overhead": "fsync", "metrics_overhead_nofsync": "nofsync"}
CPU_MODES = {"metrics_overhead_cpu_fsync": "fsync", "metrics_overhead_cpu_nofsync": "nofsync"}
METRICS_ROWS = (*OVERHEAD_MODES, *CPU_MODES, "metrics_scrape_1000")
ON, OFF = "tidelog_metrics_on", "tidelog_metrics_off"


@dataclass(frozen=True, slots=True)
class OverheadPlan:
    rounds: int  # alternations per mode: each measures both brokers once
    messages: int  # per sample


class Served(Protocol):
    """What these measurements need of a running ``tidelog serve``."""

    @property
    def bootstrap(self) -> str: ...

    @property
    def http_port(self) -> int: ...


class _Process(Protocol):
    @property
    def pid(self) -> int | None: ...


class Producing(Protocol):
    """What :func:`measure_overhead` needs of a side (``benchmarks._publish_sides.TidelogSide``)."""

    @property
    def server(self) -> _Process: ...

    async def produce(self, stream: str, payloads: Sequence[bytes], *, encrypted: bool = False) -> float: ...


def cpu_seconds(pid: int) -> float:
    """CPU time of process ``pid`` so far (its threads', not its children's): the sum of its threads'
    ``/proc/<pid>/task/<tid>/schedstat`` run times (nanoseconds; ``/proc/<pid>/stat`` counts in 10 ms ticks,
    too coarse for a sample of a fraction of a second). A thread that ended between two readings takes its time
    with it; the broker's threads (the loop, the flusher's workers) live as long as it does."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with (
            contextlib.suppress(FileNotFoundError, ProcessLookupError),
            open(f"/proc/{pid}/task/{task}/schedstat", "rb") as schedstat,
        ):
            total += int(schedstat.read().split()[0])
    return total / 1e9


async def _measured(side: Producing, stream: str, payloads: Sequence[bytes]) -> tuple[float, float]:
    """(msg/s, broker CPU µs per message) of one produce."""
    pid = side.server.pid
    assert pid is not None
    before = cpu_seconds(pid)
    rate = await side.produce(stream, payloads)
    return rate, (cpu_seconds(pid) - before) / len(payloads) * 1e6


OpenSide = Callable[[str, bool], contextlib.AbstractAsyncContextManager[Any]]
"""``(mode, metrics)``: a fresh tidelog broker in that durability mode, metrics on or off, and a side on it."""


async def measure_overhead(
    open_side: OpenSide, plan: OverheadPlan, payloads: Sequence[bytes], samples: dict[tuple[str, str], list[float]]
) -> None:
    """Every mode of :data:`OVERHEAD_MODES`: both brokers up together, one warm-up each, then ``plan.rounds``
    interleaved alternations; samples go to ``(ON|OFF, mode)`` in alternation order (so they pair up)."""
    payloads = payloads[: plan.messages]
    for mode in OVERHEAD_MODES.values():
        log(f"metrics overhead, {mode}: {plan.rounds} alternations of {len(payloads):,} messages")
        async with open_side(mode, True) as on, open_side(mode, False) as off:
            sides: dict[str, Producing] = {ON: on, OFF: off}
            for name, side in sides.items():
                await side.produce(f"warmup_{name}", payloads[: max(1, len(payloads) // 4)])
            for round_no in range(plan.rounds):
                order = (ON, OFF) if round_no % 2 == 0 else (OFF, ON)  # neither setting always goes first
                rates, cpu = {}, {}
                for name in order:
                    rates[name], cpu[name] = await _measured(sides[name], f"overhead_{round_no}_{name}", payloads)
                    samples[name, mode].append(rates[name])
                    samples[name, f"cpu_{mode}"].append(cpu[name])
                log(
                    f"  {mode} #{round_no + 1}: on {rates[ON]:,.0f}, off {rates[OFF]:,.0f} msg/s; broker CPU on "
                    f"{cpu[ON]:.1f}, off {cpu[OFF]:.1f} µs/msg"
                )


def _quartiles(values: Sequence[float]) -> list[float]:
    """Minimum, lower quartile, median, upper quartile, maximum (nearest rank), rounded."""
    ordered = sorted(values)
    last = len(ordered) - 1
    return [round(ordered[round(q * last)], 3) for q in (0, 0.25, 0.5, 0.75, 1)]


def overhead_spread(samples: dict[tuple[str, str], list[float]]) -> dict[str, dict[str, Any]]:
    """Per mode: how many alternations, each setting's min/quartiles/max in msg/s, and those of the paired
    ratio on ÷ off (sample i of each came from the same alternation)."""
    spread: dict[str, dict[str, Any]] = {}
    for mode in OVERHEAD_MODES.values():
        on, off = samples.get((ON, mode)), samples.get((OFF, mode))
        if not on or not off:
            continue
        spread[mode] = {
            "alternations": min(len(on), len(off)),
            "on_msg_s": [round(v) for v in _quartiles(on)],
            "off_msg_s": [round(v) for v in _quartiles(off)],
            "ratio_on_off": _quartiles([a / b for a, b in zip(on, off, strict=False)]),
        }
        cpu_on, cpu_off = samples.get((ON, f"cpu_{mode}")), samples.get((OFF, f"cpu_{mode}"))
        if cpu_on and cpu_off:
            spread[mode]["cpu_us_per_msg_on"] = _quartiles(cpu_on)
            spread[mode]["cpu_us_per_msg_off"] = _quartiles(cpu_off)
    return spread


_LEADS = re.compile(rb'^tidelog_partition_leader\{[^}]*stream="wide"[^}]*\} 1', re.MULTILINE)


async def scrape(http_port: int) -> tuple[float, bytes]:
    """One ``GET /metrics``, whole body read: (milliseconds, body)."""

    def get() -> tuple[float, bytes]:
        start = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=60) as response:
            body = bytes(response.read())
        if response.status != 200:
            raise RuntimeError(f"/metrics answered {response.status}")
        return (time.perf_counter() - start) * 1000, body

    return await asyncio.to_thread(get)


async def measure_scrape(served: Served, samples: dict[tuple[str, str], list[float]]) -> None:
    """Create the 1,000-partition stream, wait until the scrape shows every partition led here, then time
    :data:`SCRAPES` scrapes."""
    async with Admin(served.bootstrap) as admin:
        await admin.create_stream(WIDE_STREAM, partitions=SCRAPE_PARTITIONS)
    deadline = time.monotonic() + 120
    while len(_LEADS.findall((await scrape(served.http_port))[1])) < SCRAPE_PARTITIONS:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the {SCRAPE_PARTITIONS} partitions of {WIDE_STREAM} were not led within 120 s")
        await asyncio.sleep(0.2)
    times = [(await scrape(served.http_port))[0] for _ in range(SCRAPES)]
    samples["tidelog", "metrics_scrape_1000"].append(median(times))
    log(f"  tidelog metrics_scrape_1000: {median(times):,.1f} ms (median of {SCRAPES})")


def metrics_rows(bench: str, metric: str, unit: str, samples: dict[tuple[str, str], list[float]]) -> list[Row]:
    """The row of one of :data:`METRICS_ROWS`: median on ÷ median off for the overheads, the scrape against its
    budget."""
    if metric in OVERHEAD_MODES:
        mode = OVERHEAD_MODES[metric]
        on, off = samples.get((ON, mode)), samples.get((OFF, mode))
        return [Row(bench, metric, median(on), unit, median(off))] if on and off else []
    if metric in CPU_MODES:
        mode = CPU_MODES[metric]
        on, off = samples.get((ON, f"cpu_{mode}")), samples.get((OFF, f"cpu_{mode}"))
        return [Row(bench, metric, median(on), unit, median(off), digits=2)] if on and off else []
    scrape_ms = samples.get(("tidelog", metric))
    return [Row(bench, metric, median(scrape_ms), unit, SCRAPE_BUDGET_MS)] if scrape_ms else []
