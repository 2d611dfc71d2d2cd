"""The history checker: a clean run passes, and each kind of violation is found and named. No processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.protocol.records import NewRecord, build_batch
from tidelog.storage.checkpoint import HW_CHECKPOINT_FILE, HighWatermarkCheckpoint
from tidelog.storage.log import Log
from tidelog.testing.history import (
    History,
    HistoryViolationError,
    partition_dir,
    read_replica,
)

S = "orders"


def _v(n: int) -> bytes:
    return f"v{n}".encode()


def clean_history() -> History:
    """Five acked records, read by two consumers below the HW, held identically by three ISR replicas."""
    history = History()
    records = [(o, _v(o)) for o in range(5)]
    for offset, value in records:
        history.acked(S, 0, offset, value)
    for consumer in ("c1", "c2"):
        for offset, value in records:
            history.consumed(consumer, S, 0, offset, value, high_watermark_seen=offset + 1)
    for broker in ("b0", "b1", "b2"):
        history.replica_log(broker, S, 0, records, 5)
    history.final_read(S, 0, records)
    return history


def kinds(history: History) -> list[str]:
    return [v.kind for v in history.check().violations]


def test_a_clean_history_passes() -> None:
    report = clean_history().check()
    assert report.ok, str(report)
    assert report.stats["acked"] == 5 and report.stats["replicas"] == 3
    report.raise_if_failed()
    assert str(report).startswith("history OK")


def test_an_acked_record_missing_from_the_final_read_is_lost() -> None:
    history = clean_history()
    history.final_read(S, 0, [(o, _v(o)) for o in range(4)])  # offset 4 gone
    report = history.check()
    assert [v.kind for v in report.violations] == ["lost"]
    assert "offset 4" in report.violations[0].message and "final read" in report.violations[0].message
    with pytest.raises(HistoryViolationError, match="lost"):
        report.raise_if_failed()


def test_an_isr_replica_lacking_an_acked_record_has_lost_it() -> None:
    history = History()
    history.acked(S, 0, 0, b"a")
    history.acked(S, 0, 1, b"b")
    history.replica_log("b1", S, 0, [(0, b"a")], high_watermark=2)
    report = history.check()
    assert [v.kind for v in report.violations] == ["lost"]
    assert "b1" in report.violations[0].message


def test_a_lazily_checkpointed_hw_below_an_ack_is_no_loss() -> None:
    history = History()
    history.acked(S, 0, 0, b"a")
    history.replica_log("b1", S, 0, [(0, b"a")], high_watermark=0)  # killed before it checkpointed its HW
    assert history.check().ok


def test_a_replica_out_of_the_isr_may_lack_acked_records() -> None:
    history = clean_history()
    history.replica_log("b3", S, 0, [], high_watermark=0, in_isr=False)
    assert history.check().ok


def test_an_offset_with_two_values_is_a_conflict() -> None:
    history = clean_history()
    history.consumed("c3", S, 0, 2, b"other", high_watermark_seen=5)
    report = history.check()
    assert [v.kind for v in report.violations] == ["conflict"]
    assert "offset 2" in report.violations[0].message and "consumer c3" in report.violations[0].message


def test_replicas_conflicting_below_their_hw_are_found_even_outside_the_isr() -> None:
    history = History()
    history.replica_log("b0", S, 0, [(0, b"a"), (1, b"b")], 2)
    history.replica_log("b1", S, 0, [(0, b"a"), (1, b"x")], 2, in_isr=False)
    assert kinds(history) == ["conflict"]


def test_an_uncommitted_tail_above_the_hw_may_differ() -> None:
    history = History()
    history.replica_log("b0", S, 0, [(0, b"a"), (1, b"b")], 1)
    history.replica_log("b1", S, 0, [(0, b"a"), (1, b"diverged")], 1)
    assert history.check().ok


def test_a_read_at_or_above_the_hw_shown_is_an_uncommitted_read() -> None:
    history = clean_history()
    history.consumed("c1", S, 0, 5, b"v5", high_watermark_seen=5)
    report = history.check()
    assert [v.kind for v in report.violations] == ["uncommitted-read"]
    assert "offset 5" in report.violations[0].message and "HW 5" in report.violations[0].message


def test_a_hw_going_back_for_one_consumer_is_found() -> None:
    history = History()
    history.consumed("c1", S, 0, 0, b"a", high_watermark_seen=3)
    history.consumed("c1", S, 0, 1, b"b", high_watermark_seen=2)
    history.consumed("c2", S, 0, 0, b"a", high_watermark_seen=1)  # another consumer: its own sequence
    report = history.check()
    assert [v.kind for v in report.violations] == ["hw-went-back"]
    assert "c1" in report.violations[0].message


def test_isr_replicas_differing_below_the_hw_diverge() -> None:
    history = History()
    history.replica_log("b0", S, 0, [(0, b"a"), (1, b"b"), (2, b"c")], 3)
    history.replica_log("b1", S, 0, [(0, b"a"), (1, b"b")], 2)  # lazily checkpointed HW, but it lacks offset 2
    report = history.check()
    assert [v.kind for v in report.violations] == ["isr-divergence"]
    assert "b0 and b1" in report.violations[0].message and "HW 3" in report.violations[0].message


def test_a_refused_write_must_not_become_visible() -> None:
    history = clean_history()
    history.failed(b"v3")
    history.indeterminate(b"v4")  # may or may not be there: fine
    assert kinds(history) == ["refused-write-visible"]


def test_duplicates_are_notes_unless_configured() -> None:
    for strict in (False, True):
        history = History(duplicates_are_violations=strict)
        history.acked(S, 0, 0, b"a")
        history.acked(S, 0, 1, b"a")  # a retry after a lost ack wrote it again
        history.final_read(S, 0, [(0, b"a"), (1, b"a")])
        report = history.check()
        assert report.ok is not strict
        assert any("more than one offset" in text for text in [*report.notes, *map(str, report.violations)])


def test_unverifiable_losses_are_noted() -> None:
    history = History()
    history.acked(S, 0, 0, b"a")
    report = history.check()
    assert report.ok and any("not checked" in note for note in report.notes)


def test_partitions_are_checked_separately() -> None:
    history = History()
    history.acked(S, 0, 0, b"a")
    history.acked(S, 1, 0, b"b")
    history.final_read(S, 0, [(0, b"a")])
    history.final_read(S, 1, [(0, b"b")])
    assert history.check().ok


async def test_read_replica_from_a_data_dir(tmp_path: Path) -> None:
    older = tmp_path / "streams" / f"{S}@100" / "0"
    newer = tmp_path / "streams" / f"{S}@200" / "0"
    for path, count in ((older, 1), (newer, 3)):
        log = await Log.open_async(path)
        for n in range(count):
            await log.append(build_batch([NewRecord(_v(2 * n)), NewRecord(_v(2 * n + 1))], timestamp=1), leader_epoch=1)
        await log.close()
    HighWatermarkCheckpoint(newer / HW_CHECKPOINT_FILE).write(5)

    assert partition_dir(tmp_path, S, 0) == newer
    assert partition_dir(tmp_path, S, 0, created_ns=100) == older
    assert partition_dir(tmp_path, S, 1) is None

    snapshot = await read_replica(tmp_path, S, 0)
    assert snapshot is not None
    assert snapshot.records == [(o, _v(o)) for o in range(6)]
    assert (snapshot.high_watermark, snapshot.log_end) == (5, 6)
    old = await read_replica(tmp_path, S, 0, created_ns=100)
    assert old is not None and old.high_watermark == 0 and len(old.records) == 2
    assert await read_replica(tmp_path, "nope", 0) is None
