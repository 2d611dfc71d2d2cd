"""What the broker's metrics cost, measured inside ``benchmarks.publish`` (same run, same machine state).

- ``metrics_overhead``: ``produce_1k_fsync`` on a broker with metrics on (the publish benchmark's own tidelog
  measurement) ÷ the same on a broker started with ``metrics_enabled = false``, measured right before or after it
  (alternating by run). Target ≥ 0.97: counting requests and fsyncs costs under 3 % of the write rate.
- ``metrics_scrape_1000``: milliseconds of one ``GET /metrics`` of a broker leading a stream of 1,000 partitions
  (median of :data:`SCRAPES`). Its peer value is the 1,000 ms budget, so its ratio ≤ 1 means "answers in under a
  second".
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from benchmarks._common import Row, log, median
from tidelog.client import Admin

SCRAPE_PARTITIONS = 1000
SCRAPES = 5
SCRAPE_BUDGET_MS = 1000.0
WIDE_STREAM = "wide"
METRICS_ROWS = ("metrics_overhead", "metrics_scrape_1000")


class Served(Protocol):
    """What these measurements need of a running ``tidelog serve``."""

    @property
    def bootstrap(self) -> str: ...

    @property
    def http_port(self) -> int: ...


async def measure_metrics_off(
    open_side: Callable[[], contextlib.AbstractAsyncContextManager[Any]],
    payloads: Sequence[bytes],
    samples: dict[tuple[str, str], list[float]],
) -> None:
    """``produce_1k_fsync`` on a broker with ``metrics_enabled = false`` (``open_side`` starts it): the other half
    of ``metrics_overhead``."""
    async with open_side() as side:
        rate: float = await side.produce("produce_1k_fsync", payloads)
    samples["tidelog_metrics_off", "produce_1k_fsync"].append(rate)
    log(f"  tidelog (metrics off) produce_1k_fsync: {rate:,.0f} msg/s")


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
    """The row of one of :data:`METRICS_ROWS`: on ÷ off for the overhead, the scrape against its budget."""
    if metric == "metrics_overhead":
        on, off = samples.get(("tidelog", "produce_1k_fsync")), samples.get(("tidelog_metrics_off", "produce_1k_fsync"))
        return [Row(bench, metric, median(on), unit, median(off))] if on and off else []
    scrape_ms = samples.get(("tidelog", metric))
    return [Row(bench, metric, median(scrape_ms), unit, SCRAPE_BUDGET_MS)] if scrape_ms else []
