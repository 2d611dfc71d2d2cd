"""The group fault checker (:mod:`tidelog.testing.group_history`) on hand-made histories: each guarantee it checks,
kept and broken."""

from __future__ import annotations

from typing import Any

from tidelog.testing.group_history import GroupHistory, Session


def _acked(history: GroupHistory, partition: int, count: int) -> None:
    for offset in range(count):
        history.acked(partition, offset, f"v{offset}".encode())


def _session(partition: int, offsets: range, committed: int) -> list[dict[str, Any]]:
    """Assigned ``partition``, consumed ``offsets``, got ``committed`` acknowledged."""
    return [
        {"ev": "assigned", "p": [partition]},
        *_records(partition, offsets),
        {"ev": "commit", "p": 0, "o": committed},
    ]


def _records(partition: int, offsets: range) -> list[dict[str, Any]]:
    return [{"ev": "rec", "p": partition, "o": o, "v": f"v{o}"} for o in offsets]


def _kinds(history: GroupHistory) -> list[str]:
    return [v.kind for v in history.check().violations]


def test_a_takeover_that_resumes_at_the_last_commit_is_within_the_bound() -> None:
    history = GroupHistory()
    _acked(history, 0, 10)
    # a consumed 0..7, got 5 committed, and was killed; b resumed at 5 and read 5..9: 3 records read twice
    history.member_run("a#0", [{"ev": "assigned", "p": [0]}, *_records(0, range(8)), {"ev": "commit", "p": 0, "o": 5}])
    history.member_run(
        "b#0", [{"ev": "assigned", "p": [0]}, *_records(0, range(5, 10)), {"ev": "commit", "p": 0, "o": 10}]
    )
    for offset in (-1, 5, 5, 10):
        history.sample(0, offset)
    history.final(0, 10)
    report = history.check()
    assert report.ok, str(report)
    assert report.stats["duplicates"] == 3
    assert report.notes == ("partition 0: 3 duplicate deliveries (bound 3)",)


def test_a_takeover_from_before_the_last_commit_exceeds_the_bound() -> None:
    history = GroupHistory()
    _acked(history, 0, 10)
    history.member_run("a#0", [{"ev": "assigned", "p": [0]}, *_records(0, range(8)), {"ev": "commit", "p": 0, "o": 8}])
    history.member_run(
        "b#0", [{"ev": "assigned", "p": [0]}, *_records(0, range(2, 10)), {"ev": "commit", "p": 0, "o": 10}]
    )
    history.final(0, 10)
    assert _kinds(history) == ["duplicates over the bound"]


def test_a_committed_offset_read_lower_than_before_is_a_regression() -> None:
    history = GroupHistory()
    for offset in (3, 7, 4):
        history.sample(1, offset)
    history.sample(0, 2)
    report = history.check()
    assert [v.kind for v in report.violations] == ["offset went back"]
    assert "partition 1: 7 then 4" in str(report)


def test_an_acknowledged_record_below_the_committed_offset_that_nobody_consumed_is_reported() -> None:
    history = GroupHistory()
    _acked(history, 0, 6)
    history.member_run("a#0", [*_records(0, range(3)), *_records(0, range(4, 6)), {"ev": "commit", "p": 0, "o": 6}])
    history.final(0, 6)
    report = history.check()
    assert [v.kind for v in report.violations] == ["not consumed"]
    assert "offsets 3" in str(report)


def test_records_above_the_final_offset_are_not_required() -> None:
    history = GroupHistory()
    _acked(history, 0, 6)
    history.member_run("a#0", [*_records(0, range(3)), {"ev": "commit", "p": 0, "o": 3}])
    history.final(0, 3)
    assert history.check().ok


def test_a_value_other_than_the_acknowledged_one_is_reported() -> None:
    history = GroupHistory()
    _acked(history, 0, 2)
    history.member_run("a#0", [{"ev": "rec", "p": 0, "o": 0, "v": "v0"}, {"ev": "rec", "p": 0, "o": 1, "v": "other"}])
    assert _kinds(history) == ["wrong value"]


def test_a_revoke_ends_a_session_and_a_new_assignment_starts_one() -> None:
    history = GroupHistory()
    events = [
        {"ev": "assigned", "p": [0, 1]},
        *_records(0, range(4)),
        {"ev": "commit", "p": 0, "o": 2},
        {"ev": "revoked", "p": [0, 1]},
        {"ev": "assigned", "p": [0]},
        *_records(0, range(2, 4)),
        {"ev": "commit", "p": 0, "o": 4},
    ]
    history.member_run("a#0", events)
    history.final(0, 4)
    report = history.check()
    assert report.ok and report.stats["sessions"] == 3 and report.stats["duplicates"] == 2, str(report)


def test_what_a_session_consumed_without_a_commit() -> None:
    assert Session("a", 0, consumed=[5, 6, 7], commits=[]).uncommitted == 3
    assert Session("a", 0, consumed=[5, 6, 7], commits=[7]).uncommitted == 1
    assert Session("a", 0, consumed=[5, 6, 7], commits=[8]).uncommitted == 0
    assert Session("a", 0).uncommitted == 0
