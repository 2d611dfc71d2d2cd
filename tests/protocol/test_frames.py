"""Framing: the exact layout, the incremental decoder under any split, and hostile input."""

from __future__ import annotations

import asyncio
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.protocol.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    MAX_U32,
    PREFIX_SIZE,
    WIRE_VERSION,
    Frame,
    FrameDecoder,
    FrameError,
    FrameTooLargeError,
    Kind,
    Op,
    ProtocolError,
    encode_frame,
    encode_frame_bytes,
    read_frame,
)

Plain = tuple[Kind, int, int, bytes, bytes]


def plain(frame: Frame) -> Plain:
    return (frame.kind, frame.op, frame.correlation_id, bytes(frame.header), bytes(frame.payload))


def raw(length: int, version: int = WIRE_VERSION, kind: int = 0, op: int = 1, corr: int = 0, hlen: int = 0) -> bytes:
    return (
        length.to_bytes(4, "big")
        + bytes([version, kind])
        + op.to_bytes(2, "big")
        + corr.to_bytes(4, "big")
        + hlen.to_bytes(4, "big")
    )


frames_st = st.tuples(
    st.sampled_from(Kind),
    st.integers(0, 0xFFFF),
    st.integers(0, MAX_U32),
    st.binary(max_size=64),
    st.binary(max_size=512),
)


# -- layout ---------------------------------------------------------------------------------------------------


def test_layout_is_the_documented_one() -> None:
    data = encode_frame_bytes(Kind.RESPONSE, Op.FETCH, 0x01020304, b"HH", b"PPP")
    assert data == bytes.fromhex("00000011010100020102030400000002") + b"HHPPP"
    assert len(data) - 4 == 0x11
    assert PREFIX_SIZE == 16


def test_payload_buffers_are_passed_through_not_copied() -> None:
    first, second = b"batch-one", memoryview(b"batch-two")
    parts = encode_frame(Kind.REQUEST, Op.PRODUCE, 9, b"h", [first, second])
    assert parts[1] == b"h"
    assert parts[2] is first and parts[3] is second
    (frame,) = FrameDecoder().feed(b"".join(parts))
    assert bytes(frame.payload) == b"batch-onebatch-two"


def test_empty_header_and_payload_are_left_out() -> None:
    parts = encode_frame(Kind.REQUEST, Op.METADATA, 1, b"", b"")
    assert len(parts) == 1 and len(parts[0]) == PREFIX_SIZE
    (frame,) = FrameDecoder().feed(parts[0])
    assert plain(frame) == (Kind.REQUEST, Op.METADATA, 1, b"", b"")


def test_nbytes_of_wide_memoryviews_is_counted_in_bytes() -> None:
    wide = memoryview(bytes(8)).cast("I")  # 2 items, 8 bytes
    (frame,) = FrameDecoder().feed(encode_frame_bytes(Kind.REQUEST, 1, 1, b"", wide))
    assert len(frame.payload) == 8


@pytest.mark.parametrize(("op", "corr"), [(-1, 0), (0x10000, 0), (1, -1), (1, MAX_U32 + 1)])
def test_encode_refuses_out_of_range_fields(op: int, corr: int) -> None:
    with pytest.raises(ValueError):
        encode_frame(Kind.REQUEST, op, corr, b"")


# -- the decoder --------------------------------------------------------------------------------------------------


def test_frames_inside_one_bytes_chunk_are_views_of_it() -> None:
    chunk = encode_frame_bytes(Kind.REQUEST, 1, 1, b"a", b"xy") + encode_frame_bytes(Kind.PUSH, 2, 2, b"b", b"z")
    frames = FrameDecoder().feed(chunk)
    assert [plain(f) for f in frames] == [(Kind.REQUEST, 1, 1, b"a", b"xy"), (Kind.PUSH, 2, 2, b"b", b"z")]
    assert all(f.payload.obj is chunk and f.payload.readonly and f.header.readonly for f in frames)


def test_a_frame_split_across_chunks_is_assembled_once_and_read_only() -> None:
    data = encode_frame_bytes(Kind.REQUEST, 1, 5, b"head", b"payload")
    decoder = FrameDecoder()
    out = [frame for byte in range(len(data)) for frame in decoder.feed(data[byte : byte + 1])]
    assert [plain(f) for f in out] == [(Kind.REQUEST, 1, 5, b"head", b"payload")]
    assert out[0].payload.readonly and isinstance(out[0].payload.obj, bytearray)
    assert decoder.buffered == 0
    decoder.eof()


def test_mutable_input_is_copied_so_the_caller_may_reuse_it() -> None:
    buffer = bytearray(encode_frame_bytes(Kind.REQUEST, 1, 1, b"", b"keep"))
    (frame,) = FrameDecoder().feed(buffer)
    buffer[-4:] = b"gone"
    assert bytes(frame.payload) == b"keep"


def test_unknown_op_is_not_a_framing_error() -> None:
    (frame,) = FrameDecoder().feed(encode_frame_bytes(Kind.REQUEST, 999, 1, b""))
    assert frame.op == 999


def test_declared_length_above_the_limit_fails_after_four_bytes() -> None:
    decoder = FrameDecoder(max_frame_bytes=1024)
    with pytest.raises(FrameTooLargeError, match="1024") as info:
        decoder.feed((1025).to_bytes(4, "big"))
    assert (info.value.length, info.value.limit) == (1025, 1024)
    assert decoder.buffered == 0


def test_declared_length_is_checked_when_the_prefix_arrives_in_pieces() -> None:
    decoder = FrameDecoder(max_frame_bytes=1024)
    assert decoder.feed(b"\x00\x00") == []
    with pytest.raises(FrameTooLargeError):
        decoder.feed(b"\x10\x00")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (raw(11), "shorter"),
        (raw(12, version=2), "version 2"),
        (raw(12, kind=4), "kind 4"),
        (raw(12, hlen=1), "header length"),
        (raw(12, hlen=MAX_U32), "header length"),
    ],
)
def test_malformed_frames_raise_frame_error(data: bytes, match: str) -> None:
    with pytest.raises(FrameError, match=match):
        FrameDecoder().feed(data)


def test_the_decoder_stays_failed() -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameError):
        decoder.feed(raw(12, version=9))
    with pytest.raises(FrameError, match="already failed"):
        decoder.feed(encode_frame_bytes(Kind.REQUEST, 1, 1, b""))


def test_eof_inside_a_frame_raises() -> None:
    decoder = FrameDecoder()
    decoder.feed(encode_frame_bytes(Kind.REQUEST, 1, 1, b"abc")[:-1])
    with pytest.raises(FrameError, match="inside a frame"):
        decoder.eof()


def test_limit_must_be_sane() -> None:
    with pytest.raises(ValueError):
        FrameDecoder(max_frame_bytes=11)
    with pytest.raises(ValueError):
        FrameDecoder(max_frame_bytes=MAX_U32 + 1)
    assert FrameDecoder().max_frame_bytes == DEFAULT_MAX_FRAME_BYTES


def test_a_huge_declared_length_allocates_nothing_up_front() -> None:
    decoder = FrameDecoder(max_frame_bytes=MAX_U32)
    tracemalloc.start()
    try:
        decoder.feed(raw(MAX_U32) + b"x" * 100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert decoder.buffered == PREFIX_SIZE + 100
    assert peak < 64 * 1024


# -- properties -----------------------------------------------------------------------------------------------------


@settings(max_examples=300)
@given(frames=st.lists(frames_st, max_size=8), data=st.data())
def test_any_frames_split_anywhere_round_trip(frames: list[Plain], data: st.DataObject) -> None:
    stream = b"".join(encode_frame_bytes(*f) for f in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    decoder = FrameDecoder()
    out: list[Plain] = []
    for start, stop in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        out.extend(plain(f) for f in decoder.feed(stream[start:stop]))
    assert out == frames
    decoder.eof()


@settings(max_examples=300)
@given(frames=st.lists(frames_st, min_size=1, max_size=4), data=st.data())
def test_truncated_streams_yield_the_complete_frames_then_fail_at_eof(frames: list[Plain], data: st.DataObject) -> None:
    encoded = [encode_frame_bytes(*f) for f in frames]
    stream = b"".join(encoded)
    cut = data.draw(st.integers(0, len(stream) - 1))
    decoder = FrameDecoder()
    out = [plain(f) for f in decoder.feed(stream[:cut])]
    complete = 0
    while complete < len(encoded) and sum(map(len, encoded[: complete + 1])) <= cut:
        complete += 1
    assert out == frames[:complete]
    if sum(map(len, encoded[:complete])) == cut:
        decoder.eof()
    else:
        with pytest.raises(FrameError):
            decoder.eof()


@settings(max_examples=500)
@given(chunks=st.lists(st.binary(max_size=64), max_size=8), limit=st.integers(12, 256))
def test_random_bytes_raise_only_frame_errors_and_buffer_within_the_limit(chunks: list[bytes], limit: int) -> None:
    decoder = FrameDecoder(max_frame_bytes=limit)
    try:
        for chunk in chunks:
            for frame in decoder.feed(chunk):
                assert 4 + 12 + len(frame.header) + len(frame.payload) <= 4 + limit
            assert decoder.buffered <= 4 + limit
    except FrameError:
        pass


@given(length=st.integers(0, MAX_U32), limit=st.integers(12, 1 << 20))
def test_oversize_declared_lengths_are_refused_before_buffering(length: int, limit: int) -> None:
    decoder = FrameDecoder(max_frame_bytes=limit)
    try:
        decoder.feed(raw(length))
    except FrameTooLargeError as exc:
        assert length > limit and exc.limit == limit
        assert decoder.buffered == 0
    except FrameError:
        assert length < 12  # too short for the fixed part; the zeroed rest of the prefix is never reached
    else:
        assert 12 <= length <= limit
        assert decoder.buffered == (0 if length == 12 else 16)  # 12: the prefix alone is a whole frame


# -- read_frame --------------------------------------------------------------------------------------------------


def reader_with(data: bytes, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


async def test_read_frame_reads_frames_then_none_at_a_clean_end() -> None:
    reader = reader_with(encode_frame_bytes(Kind.REQUEST, 1, 1, b"h", b"p") + encode_frame_bytes(Kind.ERROR, 2, 2, b""))
    first, second = await read_frame(reader), await read_frame(reader)
    assert first is not None and plain(first) == (Kind.REQUEST, 1, 1, b"h", b"p")
    assert second is not None and plain(second) == (Kind.ERROR, 2, 2, b"", b"")
    assert await read_frame(reader) is None


@pytest.mark.parametrize("cut", [1, 3, 4, 10, 17])
async def test_read_frame_fails_on_a_stream_ending_inside_a_frame(cut: int) -> None:
    with pytest.raises(FrameError, match="ended inside"):
        await read_frame(reader_with(encode_frame_bytes(Kind.REQUEST, 1, 1, b"hh")[:cut]))


async def test_read_frame_refuses_an_oversize_length_without_reading_on() -> None:
    reader = reader_with(raw(2048), eof=False)
    with pytest.raises(FrameTooLargeError, match="1024"):
        await read_frame(reader, max_frame_bytes=1024)
    with pytest.raises(FrameError, match="version 0"):
        await read_frame(reader_with(raw(12, version=0)))


def test_frame_errors_are_protocol_errors() -> None:
    assert issubclass(FrameTooLargeError, FrameError) and issubclass(FrameError, ProtocolError)
