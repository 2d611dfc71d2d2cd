"""Fuzzing the checkpoint files (high watermark, leader epochs, producer snapshots) as read from disk: a value
or ``CheckpointError``, and memory proportional to the file, not to the size bound."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given

from tests.fuzz_inputs import FUZZ, inputs
from tidelog.storage.checkpoint import MAX_CHECKPOINT_BYTES, HighWatermarkCheckpoint
from tidelog.testing.fuzz_contract import check
from tidelog.testing.fuzz_targets import TARGETS

CHECKPOINTS = TARGETS["checkpoints"]


@FUZZ
@given(inputs(CHECKPOINTS))
def test_checkpoint_files(data: bytes) -> None:
    check(CHECKPOINTS, data)


def test_reading_a_small_checkpoint_allocates_what_it_holds_not_the_bound(tmp_path: Path) -> None:
    # Found by the fuzz target: read(MAX_CHECKPOINT_BYTES + 1) reserved 16 MiB for every 40-byte checkpoint.
    import tracemalloc

    checkpoint = HighWatermarkCheckpoint(tmp_path / "hw-checkpoint")
    checkpoint.write(4096)
    tracemalloc.start()
    try:
        assert checkpoint.read() == 4096
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MAX_CHECKPOINT_BYTES // 16
