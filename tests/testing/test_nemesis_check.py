"""What every nemesis run checks besides the history: the queue checker fed by the same recording, replicas
byte-identical below the HW, availability per phase. No processes."""

from __future__ import annotations

from pathlib import Path

from tidelog.protocol.records import NewRecord, build_batch
from tidelog.storage.log import Log
from tidelog.testing.nemesis_check import (
    QueueRecordingHistory,
    ReplicaSeen,
    availability,
    format_availability,
    replica_digests,
    replicas_differ,
)

S = "faults"


def test_one_recording_feeds_both_checkers() -> None:
    history = QueueRecordingHistory()
    for offset in range(3):
        history.acked(S, 0, offset, f"v{offset}".encode())
    history.consumed("c", S, 0, 0, b"v0", 3)
    history.consumed("c", S, 0, 2, b"v2", 3)  # skipped offset 1, which an ack shows holds v1
    history.final_read(S, 0, [(0, b"v0"), (1, b"v1"), (2, b"v2")])
    history.replica_log("b0", S, 0, [(0, b"v0"), (1, b"v1"), (2, b"v2")], 3)
    history.replica_log("b1", S, 0, [(0, b"v0")], 3)  # an ISR member that lost two committed offsets
    assert not history.check().ok  # the History sees the ISR replica lacking acknowledged records
    counts = history.check_queue().counts
    assert counts["poll-skip"] == 1 and counts["lost-on-node"] == 1
    assert counts["lost-write"] == counts["unseen"] == counts["duplicate"] == 0
    assert [seen.broker_id for seen in history.replicas_seen[(S, 0)]] == ["b0", "b1"]


def test_a_clean_recording_has_no_anomaly() -> None:
    history = QueueRecordingHistory()
    records = [(o, f"v{o}".encode()) for o in range(4)]
    for offset, value in records:
        history.acked(S, 1, offset, value)
        history.consumed("c", S, 1, offset, value, offset + 1)
    history.final_read(S, 1, records)
    for broker in ("b0", "b1", "b2"):
        history.replica_log(broker, S, 1, records, 4)
    assert history.check().ok and history.check_queue().ok


async def _log(path: Path, values: list[list[bytes]], epoch: int = 1) -> None:
    log = await Log.open_async(path)
    for batch in values:
        await log.append(build_batch([NewRecord(v) for v in batch], timestamp=1), leader_epoch=epoch)
    await log.close()


async def test_replicas_with_the_same_batches_below_the_hw_are_identical(tmp_path: Path) -> None:
    batches = [[b"a", b"b"], [b"c"], [b"d", b"e"]]
    for broker in ("b0", "b1"):
        await _log(tmp_path / broker / "streams" / f"{S}@1" / "0", batches)
    # b2 holds the same values, batched differently: the same records, not the same bytes.
    await _log(tmp_path / "b2" / "streams" / f"{S}@1" / "0", [[b"a"], [b"b", b"c"], [b"d", b"e"]])
    first = await replica_digests(tmp_path / "b0", S, 0, 3)
    assert first is not None and first[1] == 3  # the batch ending at 5 is above the HW of 3: left out
    dirs = {broker: tmp_path / broker for broker in ("b0", "b1", "b2")}
    seen = [ReplicaSeen("b0", 3, True), ReplicaSeen("b1", 2, True)]
    assert await replicas_differ(dirs, S, 0, seen) == []
    differing = await replicas_differ(dirs, S, 0, [*seen, ReplicaSeen("b2", 3, True)])
    assert len(differing) == 1 and "replica b2 differs from b0 below HW 3" in differing[0]
    assert await replicas_differ(dirs, S, 0, [*seen, ReplicaSeen("b2", 3, False)]) == []  # out of the ISR
    assert await replica_digests(tmp_path / "b0", "nope", 0, 3) is None


def test_availability_splits_the_run_into_phases() -> None:
    started = 100.0
    events = [(2.0, "start kill-one", "b1"), (4.0, "stop kill-one", "b1"), (5.0, "start pause-one", "b0")]
    acks = [(0.0, 100.5), (0.0, 101.5), (0.0, 103.0), (0.0, 104.5), (0.0, 105.5), (0.0, 106.5)]
    phases = availability(acks, events, started, 107.0)
    assert phases == {"quiet": (3, 3.0), "kill-one": (1, 2.0), "pause-one": (2, 2.0)}
    assert format_availability(phases) == (
        "kill-one 0.5 acks/s (1 in 2.0s), pause-one 1.0 acks/s (2 in 2.0s), quiet 1.0 acks/s (3 in 3.0s)"
    )


def test_acks_are_sends_in_the_order_they_were_sent() -> None:
    history = QueueRecordingHistory()
    history.acked(S, 0, 1, b"p-1")  # acks completing out of order: a retried batch answered late
    history.acked(S, 0, 0, b"p-0")
    history.final_read(S, 0, [(0, b"p-0"), (1, b"p-1")])
    assert history.check_queue().counts["nonmonotonic-send"] == 0
    reordered = QueueRecordingHistory()
    reordered.acked(S, 0, 0, b"p-1")  # sent later, written first
    reordered.acked(S, 0, 1, b"p-0")
    reordered.final_read(S, 0, [(0, b"p-1"), (1, b"p-0")])
    assert reordered.check_queue().counts["nonmonotonic-send"] == 1
    two = QueueRecordingHistory()  # an abandoned producer's late ack, after its successor wrote: two processes
    two.acked(S, 0, 1, b"p.1-0")
    two.acked(S, 0, 0, b"p.2-1")
    two.final_read(S, 0, [(0, b"p.2-1"), (1, b"p.1-0")])
    assert two.check_queue().counts["nonmonotonic-send"] == 0
