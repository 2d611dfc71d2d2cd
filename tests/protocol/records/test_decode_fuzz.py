"""Fuzzing the record batch codec: headers, registers, the canonical record decoder, the consumer's row decoder
and the produce-time check on damaged batches. They raise ``RecordFormatError`` or agree on the records."""

from __future__ import annotations

import pytest
from hypothesis import given

from tests.fuzz_inputs import FUZZ, inputs
from tidelog.protocol.records import (
    Codec,
    NewRecord,
    build_batch,
    check_records,
    decode_records,
    encode_varint,
    frame,
    parse_header,
    record_section,
)
from tidelog.protocol.records.errors import CorruptBatchError, DecompressedTooLargeError
from tidelog.protocol.records.rows import parse_records
from tidelog.testing.fuzz_contract import allocation_bound, check
from tidelog.testing.fuzz_targets import MAX_UNCOMPRESSED, TARGETS

RECORDS = TARGETS["record_batches"]


@FUZZ
@given(inputs(RECORDS))
def test_record_batches(data: bytes) -> None:
    check(RECORDS, data)


def _batch(*fields: bytes) -> bytes:
    """One record made of ``fields`` (key, value, header count and headers, varint-prefixed by the caller)."""
    body = b"\x00\x00\x00" + b"".join(fields)  # attributes, timestamp delta 0, offset delta 0
    record = encode_varint(len(body)) + body
    return frame(
        record,
        base_offset=0,
        leader_epoch=0,
        attributes=0,
        last_offset_delta=0,
        first_timestamp=0,
        max_timestamp=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        record_count=1,
    )


def _outcomes(batch: bytes) -> list[object]:
    header = parse_header(batch)
    section = bytes(record_section(batch, header=header))
    found: list[object] = []
    for decode in (
        lambda: [(r.key, r.value, r.headers) for r in decode_records(batch, header=header)],
        lambda: [(r.key, r.value, r.headers) for r in parse_records(section, header, "s", 0)],
        lambda: check_records(section, 0, 1 << 20).records,
    ):
        try:
            found.append(decode())
        except CorruptBatchError:
            found.append("corrupt")
    return found


V = encode_varint


@pytest.mark.parametrize(
    "fields",
    [
        (V(-33), V(1) + b"v", V(0)),  # a key length of -33 (found by fuzzing: the canonical decoder read it as null)
        (V(-1), V(-2), V(0)),  # a value length of -2
        (V(-1), V(1) + b"v", V(1), V(-1), V(1) + b"x"),  # a header name of length -1
        (V(-1), V(1) + b"v", V(1), V(1) + b"h", V(-3)),  # a header value of length -3
        (V(-1), V(1) + b"v", V(1), V(1) + b"h", V(-1)),  # a header value of -1: empty, not corrupt
        (b"\x81\x00", V(1) + b"v", V(0)),  # -1 as a two-byte varint: only the one-byte form is null
        (V(-1), V(1) + b"v"),  # no header count: the record ends at the section's end (the produce check's
        # inline reads raised IndexError there; found by fuzzing)
    ],
)
def test_the_decoders_agree_on_malformed_fields(fields: tuple[bytes, ...]) -> None:
    canonical, rows, checked = _outcomes(_batch(*fields))
    assert canonical == rows
    assert (canonical == "corrupt") == (checked == "corrupt")


def test_a_compression_bomb_stops_at_the_bound() -> None:
    bomb = build_batch([NewRecord(b"\x00" * (8 << 20))], timestamp=0, codec=Codec.ZSTD)
    assert len(bomb) < 4096
    with pytest.raises(DecompressedTooLargeError):
        decode_records(bomb, max_uncompressed=MAX_UNCOMPRESSED)
    assert check(RECORDS, bomb) < allocation_bound(RECORDS, bomb)


@pytest.mark.parametrize("count", [1, 40], ids=["alone", "run"])
def test_a_timestamp_past_int64_is_corrupt_for_every_decoder(count: int) -> None:
    # Found by fuzzing: the consumer's run path packed it into int64 lanes (OverflowError, or a silent wrap to a
    # negative timestamp), while the canonical decoder returned it as a Python int above int64.
    records = b"".join(
        encode_varint(len(body)) + body
        for body in (b"\x00" + V(10) + V(i) + V(-1) + V(1) + b"v" + V(0) for i in range(count))
    )
    batch = frame(
        records,
        base_offset=0,
        leader_epoch=0,
        attributes=0,
        last_offset_delta=count - 1,
        first_timestamp=(1 << 63) - 5,
        max_timestamp=(1 << 63) - 5,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        record_count=count,
    )
    canonical, rows, _checked = _outcomes(batch)
    assert canonical == rows == "corrupt"
