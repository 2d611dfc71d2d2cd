"""Fuzzing the wire protocol's decoders: frames cut from a byte stream (whole and in pieces) and frame headers.

The contract (:mod:`tidelog.testing.fuzz_contract`): a ``ProtocolError`` or success, bounded memory.
"""

from __future__ import annotations

from hypothesis import given

from tests.fuzz_inputs import FUZZ, inputs
from tidelog.protocol.frames import LENGTH, FrameDecoder, FrameTooLargeError
from tidelog.testing.fuzz_contract import ALLOCATION_BASE, check
from tidelog.testing.fuzz_targets import TARGETS

FRAMES = TARGETS["wire_frames"]
HEADERS = TARGETS["wire_headers"]


@FUZZ
@given(inputs(FRAMES))
def test_frame_stream(data: bytes) -> None:
    check(FRAMES, data)


@FUZZ
@given(inputs(HEADERS))
def test_frame_header(data: bytes) -> None:
    check(HEADERS, data)


def test_a_length_claiming_4_gib_is_refused_before_anything_is_buffered() -> None:
    decoder = FrameDecoder()
    data = LENGTH.pack(0xFFFF_FFFF) + b"\x01\x00\x00\x01"
    try:
        decoder.feed(data)
    except FrameTooLargeError as exc:
        assert exc.length == 0xFFFF_FFFF
    else:
        raise AssertionError("a 4 GiB frame was accepted")
    assert decoder.buffered == 0
    assert check(FRAMES, data) < ALLOCATION_BASE
