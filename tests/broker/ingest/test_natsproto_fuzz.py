"""Fuzzing the NATS protocol parser the ingest reads its server with: whole and in pieces it parses the same
messages (HMSG headers and INFO included) or raises ``natsproto.ProtocolError``."""

from __future__ import annotations

from hypothesis import given

from tests.fuzz_inputs import FUZZ, inputs
from tidelog.testing.fuzz_contract import check
from tidelog.testing.fuzz_targets import TARGETS

NATS = TARGETS["nats_protocol"]


@FUZZ
@given(inputs(NATS))
def test_nats_protocol(data: bytes) -> None:
    check(NATS, data)
