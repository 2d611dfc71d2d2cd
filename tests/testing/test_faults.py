"""Fault scenarios with real processes (issue 4, item 9): each test runs one scenario of
:mod:`tidelog.testing.faults` on a 3-broker cluster of its own and fails with the scenario's report, which
names every violation and failure and quotes the brokers' logs.

Short by default (a few seconds of load per scenario, one round of faults); ``--fault-long`` or
``TIDELOG_FAULT_LONG=1`` runs each for minutes with repeated faults (see ``conftest.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.testing.fault_run import FaultProfile, FaultReport
from tidelog.testing.faults import (
    isolate_leader,
    kill_leader,
    partition_etcd,
    partition_follower,
    partition_leader,
    partition_leader_from_etcd,
    pause_follower,
    pause_leader,
    restart_all,
)
from tidelog.testing.workload import DirectOutcome, ProduceStats, tally

slow = pytest.mark.slow


def _passed(report: FaultReport) -> None:
    print(report)  # shown with -s, and kept in the captured output of a failure
    assert report.ok, str(report)
    assert report.rounds >= 1 and report.acked > 0 and report.consumed > 0, str(report)


@slow
async def test_kill_leader_under_load(tmp_path: Path, fault_profile: FaultProfile) -> None:
    report = await kill_leader(tmp_path, fault_profile)
    _passed(report)
    assert report.failover_s, str(report)


@slow
async def test_paused_follower_leaves_and_rejoins_the_isr(tmp_path: Path, fault_profile: FaultProfile) -> None:
    report = await pause_follower(tmp_path, fault_profile)
    _passed(report)
    assert report.timings.get("acked_after_shrink_s"), "no write was acknowledged while the follower was out"


@slow
async def test_paused_leader_is_deposed_and_fenced(tmp_path: Path, fault_profile: FaultProfile) -> None:
    report = await pause_leader(tmp_path, fault_profile)
    _passed(report)
    assert report.failover_s, str(report)


@slow
async def test_isolated_leader_acknowledges_nothing_without_its_isr(
    tmp_path: Path, fault_profile: FaultProfile
) -> None:
    _passed(await isolate_leader(tmp_path, fault_profile))


@slow
async def test_leader_cut_off_from_etcd_and_followers_acknowledges_nothing(
    tmp_path: Path, fault_profile: FaultProfile
) -> None:
    """A real network partition (network namespaces): clients still reach the leader, etcd and its ISR do not."""
    _passed(await partition_leader(tmp_path, fault_profile))


@slow
async def test_leader_cut_off_from_etcd_alone_loses_no_acknowledged_write(
    tmp_path: Path, fault_profile: FaultProfile
) -> None:
    _passed(await partition_leader_from_etcd(tmp_path, fault_profile))


@slow
async def test_follower_cut_off_from_everyone_leaves_the_isr_and_rejoins(
    tmp_path: Path, fault_profile: FaultProfile
) -> None:
    _passed(await partition_follower(tmp_path, fault_profile))


@slow
async def test_etcd_cut_off_from_every_broker_loses_no_acknowledged_write(
    tmp_path: Path, fault_profile: FaultProfile
) -> None:
    _passed(await partition_etcd(tmp_path, fault_profile))


@slow
async def test_restart_all_killed_brokers(tmp_path: Path, fault_profile: FaultProfile) -> None:
    report = await restart_all(tmp_path, fault_profile)
    _passed(report)
    assert report.failed > 0, "the lone survivor should have refused acks-ALL writes (min_isr 2)"


# ---- the pieces, without processes ----


def test_first_ack_after_a_fault_counts_only_records_sent_after_it() -> None:
    stats = ProduceStats(acks=[(1.0, 1.1), (2.0, 5.0), (3.0, 3.5), (4.0, 4.2)])
    assert stats.first_ack_sent_after(2.5) == 3.5  # the record sent at 2.0 was acked later, but sent before
    assert stats.first_ack_sent_after(9.0) is None
    assert stats.acked_between(3.0, 4.5) == 2


def test_tally_and_outcome_text() -> None:
    outcomes = [DirectOutcome("acked", 7, "", 0.0), DirectOutcome("failed", -1, "NotLeaderError", 0.0)]
    assert tally(outcomes) == {"acked": 1, "failed": 1}
    assert [str(o) for o in outcomes] == ["acked at 7", "failed (NotLeaderError)"]
