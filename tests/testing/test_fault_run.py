"""A fault run's report and profiles, without a cluster (the scenarios themselves are in ``test_faults.py``)."""

from __future__ import annotations

from pathlib import Path

from tidelog.testing.fault_run import FaultProfile, FaultReport
from tidelog.testing.history import History


def test_report_is_ok_only_with_a_clean_check_and_no_failures(tmp_path: Path) -> None:
    report = FaultReport("demo", tmp_path)
    assert not report.ok  # not checked yet
    history = History()
    history.acked("s", 0, 0, b"a")
    history.final_read("s", 0, [(0, b"a")])
    report.check = history.check()
    assert report.ok
    report.failures.append("no new leader within 20s")
    assert not report.ok and "FAILURE: no new leader" in str(report)
    lost = History()
    lost.acked("s", 0, 0, b"a")
    lost.final_read("s", 0, [])
    report.failures.clear()
    report.check = lost.check()
    assert not report.ok and "VIOLATION: [lost]" in str(report)


def test_profiles() -> None:
    short, long = FaultProfile.short(), FaultProfile.long()
    assert short.rounds == 1 and long.rounds > 1 and long.hold > short.hold
