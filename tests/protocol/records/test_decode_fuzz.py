"""Fuzzing the record batch codec: headers, registers, the canonical record decoder, the consumer's row decoder
and the produce-time check on damaged batches. They raise ``RecordFormatError`` or agree on the records."""

from __future__ import annotations

from hypothesis import given

from tests.fuzz_inputs import FUZZ, inputs
from tidelog.testing.fuzz_contract import check
from tidelog.testing.fuzz_targets import TARGETS

RECORDS = TARGETS["record_batches"]


@FUZZ
@given(inputs(RECORDS))
def test_record_batches(data: bytes) -> None:
    check(RECORDS, data)
