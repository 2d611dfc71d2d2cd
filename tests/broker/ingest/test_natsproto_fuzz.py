"""Fuzzing the NATS protocol parser the ingest reads its server with: whole and in pieces it parses the same
messages (HMSG headers and INFO included) or raises ``natsproto.ProtocolError``."""

from __future__ import annotations

import pytest
from hypothesis import given

from tests.fuzz_inputs import FUZZ, inputs
from tidelog.broker.ingest import natsproto
from tidelog.testing.fuzz_contract import check
from tidelog.testing.fuzz_targets import TARGETS

NATS = TARGETS["nats_protocol"]


@FUZZ
@given(inputs(NATS))
def test_nats_protocol(data: bytes) -> None:
    check(NATS, data)


def test_an_info_nested_deeper_than_the_stack_is_a_protocol_error() -> None:
    # Found by fuzzing: json.loads raised RecursionError, which no caller of parse_info expects.
    with pytest.raises(natsproto.ProtocolError, match="INFO is not JSON"):
        natsproto.parse_info(b"[" * 50_000)
    check(NATS, b"INFO " + b"[" * 50_000 + b"\r\n")
