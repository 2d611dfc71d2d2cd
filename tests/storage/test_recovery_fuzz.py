"""Fuzzing segment recovery: damaged segment and index files, with and without a clean-shutdown marker and a
recovery point, open into a log or raise ``StorageError`` (damage in the middle), nothing else."""

from __future__ import annotations

from hypothesis import given, settings

from tests.fuzz_inputs import FUZZ, inputs
from tidelog.testing.fuzz_contract import check
from tidelog.testing.fuzz_targets import TARGETS

RECOVERY = TARGETS["segment_recovery"]


@settings(FUZZ, max_examples=100)
@given(inputs(RECOVERY))
def test_segment_recovery(data: bytes) -> None:
    check(RECOVERY, data)
