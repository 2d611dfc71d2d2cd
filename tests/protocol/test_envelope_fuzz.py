"""Fuzzing the Liftbridge envelope and the record it becomes: a NATS message is stored (enveloped or not) or
refused with ``RefusedEnvelopeError``, never crashes the ingest."""

from __future__ import annotations

from hypothesis import given

from tests.fuzz_inputs import FUZZ, inputs
from tidelog.testing.fuzz_contract import check
from tidelog.testing.fuzz_targets import TARGETS

ENVELOPE = TARGETS["liftbridge_envelope"]


@FUZZ
@given(inputs(ENVELOPE))
def test_liftbridge_envelope(data: bytes) -> None:
    check(ENVELOPE, data)
