"""A produced batch is stored only if it is whole, decodable, within the size limits and stamped sanely; each
refusal names what is wrong and what is allowed."""

from __future__ import annotations

import lz4.frame
import pytest
import zstandard

from tidelog.protocol.records import (
    CONTROL_FLAG,
    BatchBuilder,
    Codec,
    NewRecord,
    build_batch,
    check_batch,
    compress,
    frame,
)
from tidelog.protocol.records.errors import CorruptBatchError, InvalidBatchError, RecordTooLargeError
from tidelog.storage.batch_check import ProduceLimits, check_produced

NOW = 1_700_000_000_000_000_000
HOUR_NS = 3_600_000_000_000
LIMITS = ProduceLimits.of(max_message_bytes=1 << 20, max_batch_bytes=4 << 20, max_timestamp_ahead_ms=3_600_000)


def encode_records(records: list[NewRecord], first_timestamp: int) -> bytes:
    """The uncompressed, unframed record section of ``records`` (offset deltas 0..n-1)."""
    builder = BatchBuilder(first_timestamp)
    for record in records:
        builder.append(record.value, record.key, record.headers, record.timestamp)
    return builder.drain()


def framed(
    body: bytes,
    count: int,
    *,
    codec: Codec = Codec.NONE,
    first: int = NOW,
    maximum: int = NOW,
    attributes: int = 0,
) -> bytes:
    """A batch around ``body`` with a valid CRC, whatever the body holds."""
    return frame(
        body,
        base_offset=0,
        leader_epoch=0,
        attributes=int(codec) | attributes,
        last_offset_delta=count - 1,
        first_timestamp=first,
        max_timestamp=maximum,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        record_count=count,
    )


def records(count: int, size: int = 100, step_ns: int = 1000) -> list[NewRecord]:
    return [NewRecord(bytes([i % 256]) * size, timestamp=NOW + i * step_ns) for i in range(count)]


@pytest.mark.parametrize("codec", list(Codec))
def test_a_producers_batches_pass(codec: Codec) -> None:
    payload = build_batch(records(300), timestamp=NOW, codec=codec) + build_batch(records(3), timestamp=NOW)
    headers = check_produced(payload, LIMITS, NOW)
    assert [h.record_count for h in headers] == [300, 3]


def test_garbage_records_with_a_valid_crc_are_refused() -> None:
    with pytest.raises(InvalidBatchError, match=r"batch at byte 0 is not a valid record batch: record 0"):
        check_produced(framed(b"\xff" * 200, 3), LIMITS, NOW)


def test_garbage_after_decompression_is_refused() -> None:
    with pytest.raises(InvalidBatchError, match="not a valid record batch"):
        check_produced(framed(compress(b"\xff" * 5000, Codec.ZSTD), 3, codec=Codec.ZSTD), LIMITS, NOW)


def test_a_batch_must_hold_as_many_records_as_its_header_says() -> None:
    body = encode_records(records(3), NOW)
    with pytest.raises(InvalidBatchError, match="the header says 2 records, the batch holds 3"):
        check_produced(framed(body, 2, maximum=NOW + 2000), LIMITS, NOW)


def test_a_truncated_record_is_refused() -> None:
    body = encode_records(records(3), NOW)
    with pytest.raises(InvalidBatchError, match="record 2"):
        check_produced(framed(body[:-1], 3, maximum=NOW + 2000), LIMITS, NOW)


def test_the_crc_is_left_to_the_log() -> None:
    """One pass over the bytes is enough: the log checks every batch's CRC as it appends it."""
    batch = bytearray(build_batch(records(3), timestamp=NOW))
    batch[-10] ^= 1  # inside the last value: the records still decode
    assert check_produced(batch, LIMITS, NOW)
    with pytest.raises(CorruptBatchError, match="CRC mismatch"):
        check_batch(batch)


def compressed(section: bytes, codec: Codec) -> bytes:
    if codec is Codec.ZSTD:
        # Streamed, so the frame does not declare its size: decompression itself must stop at the bound.
        return b"".join(zstandard.ZstdCompressor(level=1).read_to_iter(section))
    return bytes(lz4.frame.compress(section))


@pytest.mark.parametrize("codec", [Codec.ZSTD, Codec.LZ4])
def test_a_decompression_bomb_stops_at_the_batch_limit(codec: Codec) -> None:
    many = [NewRecord(bytes(1000)) for _ in range(64 << 10)]  # 64 MiB of zeros: a few KiB compressed
    body = compressed(encode_records(many, NOW), codec)
    assert len(body) < 1 << 20
    with pytest.raises(RecordTooLargeError, match=r"decompress to more than 4194304 bytes.*max_message_bytes"):
        check_produced(framed(body, len(many), codec=codec), LIMITS, NOW)


@pytest.mark.parametrize("size", [6_000_000, 64 << 20])
@pytest.mark.parametrize("codec", [Codec.ZSTD, Codec.LZ4])
def test_one_message_larger_than_a_batch_may_hold_is_named_by_its_size(codec: Codec, size: int) -> None:
    """A message sent alone that decompresses past the batch bound is refused as a message above
    max_message_bytes, by its own size, not by a batch's."""
    body = compressed(encode_records([NewRecord(bytes(size), key=b"k")], NOW), codec)
    with pytest.raises(RecordTooLargeError) as refused:
        check_produced(framed(body, 1, codec=codec), LIMITS, NOW)
    assert str(refused.value) == f"record 0 is {size + 1} bytes (key and value), above max_message_bytes (1048576)"


def test_a_record_above_max_message_bytes_is_refused_even_compressed() -> None:
    big = build_batch([NewRecord(b"a"), NewRecord(bytes(2 << 20)), NewRecord(b"c")], timestamp=NOW, codec=Codec.ZSTD)
    with pytest.raises(RecordTooLargeError, match=r"record 1 is 2097152 bytes .*max_message_bytes \(1048576\)"):
        check_produced(big, LIMITS, NOW)


def test_a_timestamp_too_far_ahead_is_refused() -> None:
    ahead = NOW + HOUR_NS + 1_000_000
    batch = build_batch([NewRecord(b"a"), NewRecord(b"b", timestamp=ahead)], timestamp=NOW)
    with pytest.raises(InvalidBatchError, match=r"3600001 ms ahead.*max_timestamp_ahead_ms \(3600000\)"):
        check_produced(batch, LIMITS, NOW)
    assert check_produced(batch, LIMITS, NOW + 2_000_000)  # within the hour of a later clock


def test_the_header_max_timestamp_may_not_be_below_a_records() -> None:
    body = encode_records(records(3, step_ns=1000), NOW)
    with pytest.raises(InvalidBatchError, match=r"timestamp \d+ ns is above the batch header's max_timestamp"):
        check_produced(framed(body, 3, maximum=NOW + 1000), LIMITS, NOW)
    assert check_produced(framed(body, 3, maximum=NOW + 2000), LIMITS, NOW)


@pytest.mark.parametrize(("first", "maximum"), [(-5, 0), (NOW, NOW - 1)])
def test_header_timestamps_must_be_ordered_and_not_negative(first: int, maximum: int) -> None:
    builder = BatchBuilder(first)
    builder.append(b"v", timestamp=first)
    body = builder.drain()
    with pytest.raises(InvalidBatchError, match="0 <= first_timestamp <= max_timestamp"):
        check_produced(framed(body, 1, first=first, maximum=maximum), LIMITS, NOW)


def test_a_record_stamped_before_the_epoch_is_refused() -> None:
    body = encode_records([NewRecord(b"a", timestamp=NOW), NewRecord(b"b", timestamp=-1)], NOW)
    with pytest.raises(InvalidBatchError, match="may not be negative"):
        check_produced(framed(body, 2), LIMITS, NOW)


def test_control_batches_and_empty_payloads_are_not_for_clients() -> None:
    body = encode_records(records(1), NOW)
    with pytest.raises(InvalidBatchError, match="control batch"):
        check_produced(framed(body, 1, attributes=CONTROL_FLAG), LIMITS, NOW)
    with pytest.raises(InvalidBatchError, match="no bytes"):
        check_produced(b"", LIMITS, NOW)


def test_the_second_batch_of_a_payload_is_named() -> None:
    payload = build_batch(records(2), timestamp=NOW) + framed(b"\xff" * 50, 1)
    with pytest.raises(InvalidBatchError, match=f"batch at byte {len(build_batch(records(2), timestamp=NOW))}"):
        check_produced(payload, LIMITS, NOW)
