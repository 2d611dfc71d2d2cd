"""``/api/series``: the recent history behind the web view's charts, sampled from what ``/metrics`` exports.

Each sample runs the broker's :class:`~tidelog.ui.collectors.BrokerCollector` (the same families a scrape gets)
and keeps four numbers: records and bytes written per second to the partitions led here (the rate between this
sample and the one before; a counter that went down, because leadership moved, counts as zero), and the largest
follower lag in records and in seconds. Samples are taken when someone asks, at most one per
:data:`MIN_INTERVAL`, and the last :data:`CAPACITY` are kept: the charts show the history since a page first
watched, and a broker nobody watches does no work for them. ``metrics_partition_level = false`` leaves the
per-partition families out, and with them the charts' data (they stay at zero).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from tidelog.ui.collectors import BrokerCollector
from tidelog.ui.view import BrokerView

__all__ = ["CAPACITY", "MIN_INTERVAL", "Series"]

CAPACITY = 300
"""Samples kept (five minutes at one a second)."""
MIN_INTERVAL = 1.0
"""Fewest seconds between two samples, however many pages ask."""


@dataclass(frozen=True, slots=True)
class _Totals:
    at: float
    records_in: float
    bytes_in: float
    lag_records: float
    lag_seconds: float


class Series:
    """Samples of one broker's throughput and replication lag, as columns for uPlot."""

    def __init__(self, view: BrokerView, clock: Callable[[], float] = time.time) -> None:
        self._collector = BrokerCollector(view)
        self._clock = clock
        self._last: _Totals | None = None
        self._rows: deque[tuple[float, float, float, float, float]] = deque(maxlen=CAPACITY)

    def sample(self) -> None:
        """Take a sample unless the last one is younger than :data:`MIN_INTERVAL`."""
        now = self._clock()
        if self._last is not None and now - self._last.at < MIN_INTERVAL:
            return
        totals = self._totals(now)
        last, self._last = self._last, totals
        if last is None:
            return
        elapsed = totals.at - last.at
        records = max(0.0, totals.records_in - last.records_in) / elapsed
        nbytes = max(0.0, totals.bytes_in - last.bytes_in) / elapsed
        self._rows.append((round(now, 3), records, nbytes, totals.lag_records, totals.lag_seconds))

    def columns(self) -> dict[str, list[float]]:
        """Sample then answer: time (Unix seconds) and one list per series, of equal lengths."""
        self.sample()
        names = ("t", "records_per_second", "bytes_per_second", "max_lag_records", "max_lag_seconds")
        return {name: [row[i] for row in self._rows] for i, name in enumerate(names)}

    def _totals(self, now: float) -> _Totals:
        sums = {
            "tidelog_partition_records_in": 0.0,
            "tidelog_partition_bytes_in": 0.0,
        }
        peaks = {"tidelog_follower_lag_records": 0.0, "tidelog_follower_lag_seconds": 0.0}
        for family in self._collector.collect():
            if family.name in sums:
                sums[family.name] += sum(s.value for s in family.samples if s.name.endswith("_total"))
            elif family.name in peaks:
                peaks[family.name] = max((s.value for s in family.samples), default=0.0)
        return _Totals(
            now,
            sums["tidelog_partition_records_in"],
            sums["tidelog_partition_bytes_in"],
            peaks["tidelog_follower_lag_records"],
            peaks["tidelog_follower_lag_seconds"],
        )
