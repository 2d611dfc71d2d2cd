"""Fuzzing the check of a segment file a follower downloaded from its leader (far-horizon catch-up): it is
refused with a ``RecordFormatError`` or verified, nothing else, before anything is installed."""

from __future__ import annotations

from hypothesis import given

from tests.fuzz_inputs import FUZZ, inputs
from tidelog.testing.fuzz_contract import check
from tidelog.testing.fuzz_targets import TARGETS

STAGED = TARGETS["staged_segment"]


@FUZZ
@given(inputs(STAGED))
def test_staged_segment(data: bytes) -> None:
    check(STAGED, data)
