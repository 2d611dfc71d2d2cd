"""Expected-offset appends from several clients while the leader is killed: the history is linearizable
(issue 5), checked by :mod:`tidelog.testing.linearizability` over a real 3-broker cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.testing.cas_faults import run_cas_faults

pytestmark = pytest.mark.slow


async def test_expected_offset_appends_stay_linearizable_through_a_leader_kill(tmp_path: Path) -> None:
    report = await run_cas_faults(tmp_path, rounds=1, clients=3, hold=1.5)
    print(report)
    assert report.ok, str(report)
    assert report.rounds == 1, str(report)
    assert report.outcomes["ok"] > 10 and report.outcomes["wrong-offset"] > 0, str(report)
    assert report.check is not None and report.check.stats["ok"] == report.outcomes["ok"], str(report)
