"""Fuzzing the checkpoint files (high watermark, leader epochs, producer snapshots) as read from disk: a value
or ``CheckpointError``, and memory proportional to the file, not to the size bound."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given

from tests.fuzz_inputs import FUZZ, inputs
from tidelog.storage.checkpoint import MAX_CHECKPOINT_BYTES, HighWatermarkCheckpoint
from tidelog.storage.damage import DAMAGE_FILE, DamageRegistry
from tidelog.testing.fuzz_contract import check
from tidelog.testing.fuzz_targets import TARGETS

CHECKPOINTS = TARGETS["checkpoints"]


@FUZZ
@given(inputs(CHECKPOINTS))
def test_checkpoint_files(data: bytes) -> None:
    check(CHECKPOINTS, data)


def test_reading_a_small_checkpoint_allocates_what_it_holds_not_the_bound(tmp_path: Path) -> None:
    # Found by the fuzz target: read(MAX_CHECKPOINT_BYTES + 1) reserved 16 MiB for every 40-byte checkpoint.
    checkpoint = HighWatermarkCheckpoint(tmp_path / "hw-checkpoint")
    checkpoint.write(4096)
    tracemalloc.start()
    try:
        assert checkpoint.read() == 4096
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MAX_CHECKPOINT_BYTES // 16


@pytest.mark.parametrize(
    "content",
    [
        b"[" * 50_000,
        b'{"version": 1, "ranges": [{"first": "a", "last": 9}]}',
        b'{"version": 1, "ranges": [{"first": 9, "last": 3}]}',
    ],
    ids=["deep", "not-an-offset", "reversed"],
)
def test_an_unreadable_damage_registry_reads_as_empty(tmp_path: Path, content: bytes) -> None:
    # Found by fuzzing: deep nesting raised RecursionError out of load; a string offset was accepted.
    (tmp_path / DAMAGE_FILE).write_bytes(content)
    assert DamageRegistry.load(tmp_path).ranges == []
