"""Shared pieces of the benchmarks: the output contract, medians, targets, scratch directories.

The contract (``DEVELOPERS.md``, "Benchmarks: the output contract"): stdout carries only JSON, one object per
line — one per metric (``bench``, ``metric``, ``value``, ``unit``, ``peer_value``, ``ratio``), values being medians
of several runs, then a last ``"metric": "summary"`` line saying which targets were met. Progress goes to stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["Row", "RunClock", "Target", "emit", "log", "median", "report", "scratch_dir", "summary"]

_STARTED = time.monotonic()


def log(message: str) -> None:
    """A progress line on stderr, stamped with the seconds since the benchmark started."""
    print(f"[{time.monotonic() - _STARTED:7.1f}s] {message}", file=sys.stderr, flush=True)


def emit(document: Mapping[str, object]) -> None:
    """One JSON object on one line of stdout."""
    print(json.dumps(document), flush=True)


def median(samples: Sequence[float]) -> float:
    if not samples:
        raise ValueError("no samples")
    return float(statistics.median(samples))


@dataclass(frozen=True, slots=True)
class Row:
    """One metric line: tidelog's median ``value`` and, where there is a peer, the peer's and their ratio."""

    bench: str
    metric: str
    value: float
    unit: str
    peer_value: float | None = None
    digits: int = 1

    @property
    def ratio(self) -> float | None:
        """tidelog ÷ peer (for latencies too: there ≤ 1 is better)."""
        if self.peer_value is None or self.peer_value == 0:
            return None
        return self.value / self.peer_value

    def document(self) -> dict[str, object]:
        ratio = self.ratio
        return {
            "bench": self.bench,
            "metric": self.metric,
            "value": round(self.value, self.digits),
            "unit": self.unit,
            "peer_value": None if self.peer_value is None else round(self.peer_value, self.digits),
            "ratio": None if ratio is None else round(ratio, 3),
        }


@dataclass(frozen=True, slots=True)
class Target:
    """A bound on a metric's ratio: ``ratio >= bound`` or ``ratio <= bound``."""

    metric: str
    op: Literal[">=", "<="]
    bound: float

    def met(self, ratio: float | None) -> bool:
        if ratio is None:
            return False
        return ratio >= self.bound if self.op == ">=" else ratio <= self.bound

    def __str__(self) -> str:
        return f"ratio {self.op} {self.bound:g}"


def summary(bench: str, rows: Sequence[Row], targets: Sequence[Target], **extra: object) -> dict[str, object]:
    """The last line: every metric with its ratio, and each target with whether it was met."""
    by_metric = {row.metric: row for row in rows}
    checked: list[dict[str, object]] = []
    for target in targets:
        row = by_metric.get(target.metric)
        ratio = row.ratio if row is not None else None
        checked.append(
            {
                "metric": target.metric,
                "ratio": None if ratio is None else round(ratio, 3),
                "target": str(target),
                "met": target.met(ratio),
            }
        )
    return {
        "bench": bench,
        "metric": "summary",
        "metrics": [
            {"metric": row.metric, "ratio": None if row.ratio is None else round(row.ratio, 3)} for row in rows
        ],
        "targets": checked,
        "met": sum(1 for each in checked if each["met"]),
        "of": len(checked),
        "all_met": all(each["met"] for each in checked),
        **extra,
    }


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A fresh directory under ``$TMPDIR`` (one disk for every side of a benchmark), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("TMPDIR")))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class RunClock:
    """When a benchmark run started and how loaded the machine was then: its summary reports both, so a reader
    can tell a run on a shared, busy machine from a quiet one."""

    started: float
    load: float

    @classmethod
    def now(cls) -> RunClock:
        return cls(time.monotonic(), os.getloadavg()[0])


def report(bench: str, rows: Sequence[Row], targets: Sequence[Target], clock: RunClock, **extra: object) -> None:
    """Print every metric line, then the summary, with the run's duration and the load average before and after."""
    for row in rows:
        emit(row.document())
    emit(
        summary(
            bench,
            rows,
            targets,
            **extra,
            seconds=round(time.monotonic() - clock.started, 1),
            loadavg_1m=[round(clock.load, 2), round(os.getloadavg()[0], 2)],
        )
    )
