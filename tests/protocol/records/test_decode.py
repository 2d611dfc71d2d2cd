"""The record batch codec: round trips, in-place offset assignment, compaction rebuilds, and hostile input.

The hostile suite holds the codec to its promise: bytes that are not a valid batch raise
``CorruptBatchError`` — never another exception, never a hang — and decoding allocates in proportion to the
bytes it was given (or to the decompression limit), never to a length or count the bytes merely claim.
Much of it re-seals mutated batches with a correct CRC: a producer computes the CRC itself, so the record
decoder must survive anything behind a valid one.
"""

from __future__ import annotations

import struct
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import crc32c
import lz4.frame
import pytest
import zstandard
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tidelog.protocol.records import (
    CONTROL_FLAG,
    CRC_POS,
    CRC_START,
    HEADER,
    HEADER_SIZE,
    LENGTH_FIELD_END,
    TRANSACTIONAL_FLAG,
    Codec,
    NewRecord,
    Record,
    RecordBatch,
    assign_offsets,
    build_batch,
    check_batch,
    crc_ok,
    decode_records,
    encode_varint,
    iter_batches,
    parse_header,
    rebuild_batch,
    records_of,
)
from tidelog.protocol.records.errors import CorruptBatchError

NOW = 1_700_000_000_000_000_000  # ns
HOSTILE = settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
MiB = 1024 * 1024

# header field positions (see tidelog.protocol.records.layout)
BATCH_LENGTH_POS = 8
LEADER_EPOCH_POS = 12
FORMAT_VERSION_POS = 16
ATTRIBUTES_POS = 21
LAST_OFFSET_DELTA_POS = 23
RECORD_COUNT_POS = 57

# --------------------------------------------------------------------------------------------- strategies

blobs = st.none() | st.binary(max_size=48)
headers = st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=16)), max_size=3)
timestamps = st.none() | st.integers(min_value=0, max_value=(1 << 62))
new_records = st.builds(NewRecord, value=blobs, key=blobs, headers=headers, timestamp=timestamps)
codecs = st.sampled_from(list(Codec))


def expected(records: list[NewRecord], base_offset: int, default_ts: int) -> list[Record]:
    return [
        Record(
            base_offset + i,
            default_ts if r.timestamp is None else r.timestamp,
            r.key,
            r.value,
            tuple(r.headers),
        )
        for i, r in enumerate(records)
    ]


def reseal(buf: bytearray) -> bytearray:
    """Recompute the CRC over what the header claims is the batch, as a hostile producer would."""
    size = struct.unpack_from(">i", buf, BATCH_LENGTH_POS)[0] + LENGTH_FIELD_END
    end = min(max(size, CRC_START), len(buf))
    struct.pack_into(">I", buf, CRC_POS, crc32c.crc32c(bytes(buf[CRC_START:end])))
    return buf


def frame(
    body: bytes,
    *,
    record_count: int,
    last_offset_delta: int | None = None,
    codec: Codec = Codec.NONE,
    base_offset: int = 0,
    first_timestamp: int = NOW,
) -> bytes:
    """A batch around an arbitrary record section, with a valid CRC."""
    out = bytearray(HEADER_SIZE + len(body))
    delta = record_count - 1 if last_offset_delta is None else last_offset_delta
    HEADER.pack_into(
        out, 0, base_offset, len(out) - 12, 0, 1, 0, int(codec), delta, first_timestamp, first_timestamp,
        -1, -1, -1, record_count,
    )  # fmt: skip
    out[HEADER_SIZE:] = body
    return bytes(reseal(out))


def raw_record(
    off_delta: int,
    key: bytes | None = None,
    value: bytes | None = b"v",
    *,
    ts_delta: int = 0,
    headers: list[tuple[bytes | None, bytes | None]] | None = None,
) -> bytes:
    """One record encoded by hand, so tests can write what ``build_batch`` never would."""

    def field(data: bytes | None) -> bytes:
        return encode_varint(-1) if data is None else encode_varint(len(data)) + data

    hdrs = headers or []
    payload = (
        b"\x00"
        + encode_varint(ts_delta)
        + encode_varint(off_delta)
        + field(key)
        + field(value)
        + encode_varint(len(hdrs))
        + b"".join(field(k) + field(v) for k, v in hdrs)
    )
    return encode_varint(len(payload)) + payload


def every_decoder(buf: bytes, *, limit: int = 64 * MiB) -> None:
    """Run every public decoding entry point over ``buf``; only ``CorruptBatchError`` may escape any of them."""
    attempts: list[Callable[[], Any]] = [
        lambda: parse_header(buf),
        lambda: check_batch(buf),
        lambda: decode_records(buf, max_uncompressed=limit),  # no CRC check: the record decoder itself
        lambda: list(iter_batches(buf)),
        lambda: list(iter_batches(buf, verify=False)),
        lambda: list(records_of(buf)),
        lambda: RecordBatch(buf).records(limit),
        lambda: RecordBatch(buf, verify=False).records(limit),
    ]
    for attempt in attempts:
        with suppress(CorruptBatchError):
            attempt()


@contextmanager
def peak_allocation() -> Iterator[list[int]]:
    """Measure the peak of Python-tracked allocations inside the block (appended to the yielded list)."""
    result: list[int] = []
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        yield result
        result.append(tracemalloc.get_traced_memory()[1])
    finally:
        tracemalloc.stop()


# --------------------------------------------------------------------------------------------- round trips


@settings(max_examples=150, deadline=None)
@given(
    st.lists(new_records, min_size=1, max_size=12),
    codecs,
    st.integers(min_value=0, max_value=1 << 62),
    st.integers(min_value=0, max_value=(1 << 31) - 1),
)
def test_round_trip(records: list[NewRecord], codec: Codec, base_offset: int, epoch: int) -> None:
    buf = build_batch(records, timestamp=NOW, codec=codec, base_offset=base_offset, leader_epoch=epoch)
    header = check_batch(buf)
    assert header.size == len(buf)
    assert header.base_offset == base_offset
    assert header.leader_epoch == epoch
    assert header.codec is codec
    assert header.record_count == len(records) == header.last_offset_delta + 1
    stamps = [NOW if r.timestamp is None else r.timestamp for r in records]
    assert header.first_timestamp == stamps[0]
    assert header.max_timestamp == max(stamps)
    assert decode_records(buf) == expected(records, base_offset, NOW)
    assert list(RecordBatch(buf).records()) == expected(records, base_offset, NOW)


@pytest.mark.parametrize("codec", list(Codec))
def test_nulls_empties_and_headers_are_distinct(codec: Codec) -> None:
    records = [
        NewRecord(value=None, key=None),
        NewRecord(value=b"", key=b""),
        NewRecord(value=b"v", key=None, headers=[("", b""), ("ü-ñ", b"\x00\xff"), ("dup", b"1"), ("dup", b"2")]),
        NewRecord(value=None, key=b"k", timestamp=NOW - 5),  # a tombstone, older than the batch's first
    ]
    buf = build_batch(records, timestamp=NOW, codec=codec, base_offset=10)
    decoded = decode_records(buf)
    assert [(r.key, r.value) for r in decoded] == [(None, None), (b"", b""), (None, b"v"), (b"k", None)]
    assert decoded[2].headers == (("", b""), ("ü-ñ", b"\x00\xff"), ("dup", b"1"), ("dup", b"2"))
    assert decoded[3].timestamp == NOW - 5
    assert [r.offset for r in decoded] == [10, 11, 12, 13]


@pytest.mark.parametrize("codec", list(Codec))
def test_many_records(codec: Codec) -> None:
    records = [NewRecord(value=b"value-%d" % i, key=b"key-%d" % (i % 100)) for i in range(20_000)]
    buf = build_batch(records, timestamp=NOW, codec=codec, base_offset=1_000_000)
    header = check_batch(buf)
    assert header.record_count == 20_000
    assert header.last_offset == 1_019_999
    decoded = decode_records(buf)
    assert decoded[0] == Record(1_000_000, NOW, b"key-0", b"value-0")
    assert decoded[-1] == Record(1_019_999, NOW, b"key-99", b"value-19999")
    if codec is not Codec.NONE:
        assert len(buf) < len(build_batch(records, timestamp=NOW)) // 2  # it really was compressed


@pytest.mark.parametrize("codec", [Codec.ZSTD, Codec.LZ4])
def test_large_values_compress_and_decode(codec: Codec) -> None:
    value = bytes(range(256)) * (3 * 4096)  # 3 MiB, larger than one decompression step
    buf = build_batch([NewRecord(value=value), NewRecord(value=value[::-1])], timestamp=NOW, codec=codec)
    assert [r.value for r in decode_records(buf)] == [value, value[::-1]]


def test_timestamps_at_the_edges_of_int64() -> None:
    low, high = -(1 << 63), (1 << 63) - 1
    buf = build_batch([NewRecord(b"a", timestamp=low), NewRecord(b"b", timestamp=-1)], timestamp=NOW)
    assert [r.timestamp for r in decode_records(buf)] == [low, -1]
    buf = build_batch([NewRecord(b"a", timestamp=0), NewRecord(b"b", timestamp=high)], timestamp=NOW)
    assert [r.timestamp for r in decode_records(buf)] == [0, high]


def test_timestamp_spread_beyond_int64_is_refused_not_stored_wrong() -> None:
    with pytest.raises(ValueError):
        build_batch([NewRecord(b"a", timestamp=-(1 << 63)), NewRecord(b"b", timestamp=(1 << 63) - 1)], timestamp=0)


def test_producer_fields_and_flags() -> None:
    buf = build_batch(
        [NewRecord(b"x")],
        timestamp=NOW,
        producer_id=77,
        producer_epoch=3,
        base_sequence=900,
        transactional=True,
        control=True,
        codec=Codec.LZ4,
    )
    header = check_batch(buf)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (77, 3, 900)
    assert header.is_transactional and header.is_control
    assert header.attributes == int(Codec.LZ4) | TRANSACTIONAL_FLAG | CONTROL_FLAG
    plain = parse_header(build_batch([NewRecord(b"x")], timestamp=NOW))
    assert (plain.producer_id, plain.producer_epoch, plain.base_sequence) == (-1, -1, -1)
    assert not plain.is_transactional and not plain.is_control


def test_layout() -> None:
    buf = build_batch([NewRecord(b"abc", key=b"k")], timestamp=NOW, base_offset=5, leader_epoch=9)
    assert HEADER_SIZE == 61
    assert struct.unpack_from(">q", buf, 0)[0] == 5
    assert struct.unpack_from(">i", buf, BATCH_LENGTH_POS)[0] == len(buf) - 12
    assert struct.unpack_from(">i", buf, LEADER_EPOCH_POS)[0] == 9
    assert buf[FORMAT_VERSION_POS] == 1
    assert struct.unpack_from(">I", buf, CRC_POS)[0] == crc32c.crc32c(buf[CRC_START:])


def test_empty_batch_is_refused() -> None:
    with pytest.raises(ValueError):
        build_batch([], timestamp=NOW)


# --------------------------------------------------------------------------------------------- assign_offsets


@settings(max_examples=100, deadline=None)
@given(
    st.lists(new_records, min_size=1, max_size=5),
    codecs,
    st.integers(min_value=0, max_value=(1 << 63) - 1 - 10),
    st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1),
    st.binary(max_size=8),
)
def test_assign_offsets_changes_only_base_offset_and_epoch(
    records: list[NewRecord], codec: Codec, base_offset: int, epoch: int, before: bytes
) -> None:
    original = build_batch(records, timestamp=NOW, codec=codec)
    buf = bytearray(before + original + b"tail")
    pos = len(before)
    assign_offsets(buf, pos, base_offset, epoch)
    assigned = bytes(buf[pos : pos + len(original)])
    changed = {i for i in range(len(original)) if assigned[i] != original[i]}
    assert changed <= set(range(0, 8)) | set(range(LEADER_EPOCH_POS, LEADER_EPOCH_POS + 4))
    assert buf[:pos] == before and buf[pos + len(original) :] == b"tail"
    header = check_batch(buf, pos)  # CRC still valid: it does not cover these fields
    assert header._replace(base_offset=0, leader_epoch=0) == parse_header(original)
    assert (header.base_offset, header.leader_epoch) == (base_offset, epoch)
    assert [r.offset for r in decode_records(buf, pos, header=header)] == [base_offset + i for i in range(len(records))]


def test_assign_offsets_through_a_memoryview() -> None:
    buf = bytearray(build_batch([NewRecord(b"a"), NewRecord(b"b")], timestamp=NOW))
    assign_offsets(memoryview(buf), 0, 42, 7)
    assert [r.offset for r in records_of(buf)] == [42, 43]
    assert check_batch(buf).leader_epoch == 7


# --------------------------------------------------------------------------------------------- rebuild_batch


@settings(max_examples=100, deadline=None)
@given(st.lists(new_records, min_size=1, max_size=10), codecs, st.data())
def test_rebuild_keeps_offsets_span_and_fields(records: list[NewRecord], codec: Codec, data: st.DataObject) -> None:
    original = build_batch(
        records, timestamp=NOW, codec=codec, base_offset=500, leader_epoch=4, producer_id=9, transactional=True
    )
    header = check_batch(original)
    decoded = decode_records(original)
    keep = data.draw(st.lists(st.booleans(), min_size=len(decoded), max_size=len(decoded)))
    subset = [r for r, k in zip(decoded, keep, strict=True) if k]
    rebuilt = rebuild_batch(header, subset)
    new_header = check_batch(rebuilt)
    assert new_header._replace(record_count=0, crc=0, batch_length=0) == header._replace(
        record_count=0, crc=0, batch_length=0
    )
    assert new_header.record_count == len(subset)
    assert new_header.last_offset == header.last_offset  # the batch still spans the same offsets
    assert decode_records(rebuilt) == subset


# --------------------------------------------------------------------------------------------- many batches


def test_iter_batches_and_records_of_over_concatenated_batches() -> None:
    a = build_batch([NewRecord(b"a"), NewRecord(b"b")], timestamp=NOW, base_offset=0)
    b = build_batch([NewRecord(b"c")], timestamp=NOW, base_offset=2, codec=Codec.ZSTD)
    c = build_batch([NewRecord(b"d")], timestamp=NOW, base_offset=3, codec=Codec.LZ4)
    buf = a + b + c
    assert [(pos, h.base_offset) for pos, h in iter_batches(buf)] == [(0, 0), (len(a), 2), (len(a) + len(b), 3)]
    assert [r.value for r in records_of(buf)] == [b"a", b"b", b"c", b"d"]
    assert list(iter_batches(b"")) == []


def test_record_batch_view() -> None:
    buf = build_batch([NewRecord(b"a")], timestamp=NOW, base_offset=3, codec=Codec.ZSTD)
    view = RecordBatch(buf)
    assert view.records() == [Record(3, NOW, None, b"a")]
    assert "offsets=3..3" in repr(view) and "ZSTD" in repr(view)
    with pytest.raises(CorruptBatchError, match="buffer holds"):
        RecordBatch(buf + b"x")


def test_decoding_a_small_compressed_batch_does_not_reserve_the_limit() -> None:
    """Unsized frames used to reserve ``max_uncompressed`` (64 MiB) up front on every decode."""
    unsized_zstd = zstandard.ZstdCompressor(write_content_size=False).compress(raw_record(0))
    for codec, body in [(Codec.ZSTD, unsized_zstd), (Codec.LZ4, lz4.frame.compress(raw_record(0)))]:
        buf = frame(body, record_count=1, codec=codec)
        with peak_allocation() as peak:
            assert decode_records(buf)[0].value == b"v"
        assert peak[0] < MiB, codec


# --------------------------------------------------------------------------------------------- hostile input


SMALL = build_batch([NewRecord(b"value", key=b"key", headers=[("h", b"1")])], timestamp=NOW, base_offset=7)
MIXED = [
    build_batch(
        [NewRecord(b"v%d" % i, key=b"k%d" % i, headers=[("n", b"x")]) for i in range(6)],
        timestamp=NOW,
        codec=codec,
        base_offset=100,
    )
    for codec in Codec
]


def test_every_truncation_of_a_batch_is_refused() -> None:
    for batch in [SMALL, *MIXED]:
        for cut in range(len(batch)):
            with pytest.raises(CorruptBatchError):
                check_batch(batch[:cut])
            if cut:
                with pytest.raises(CorruptBatchError):
                    list(iter_batches(SMALL + batch[:cut]))  # a torn tail after a good batch
                every_decoder(batch[:cut])


@HOSTILE
@given(st.binary(max_size=400))
def test_random_bytes(buf: bytes) -> None:
    every_decoder(buf)


@HOSTILE
@given(st.binary(min_size=HEADER_SIZE - 21, max_size=300), codecs, st.integers(-5, 40))
def test_random_bytes_behind_a_plausible_header_and_valid_crc(tail: bytes, codec: Codec, count: int) -> None:
    """Random bytes where the records or the compressed frame should be."""
    every_decoder(frame(tail, record_count=count, last_offset_delta=max(count, 0) + 3, codec=codec))


@HOSTILE
@given(st.binary(max_size=300), st.sampled_from([Codec.ZSTD, Codec.LZ4]), st.integers(0, 40))
def test_random_record_sections_that_decompress_fine(body: bytes, codec: Codec, count: int) -> None:
    compressed = zstandard.ZstdCompressor().compress(body) if codec is Codec.ZSTD else lz4.frame.compress(body)
    every_decoder(frame(compressed, record_count=count, last_offset_delta=count + 3, codec=codec))


varint_fields = st.one_of(
    st.integers(-2, 20),
    st.sampled_from([-(1 << 63), (1 << 63) - 1, 1 << 31, -(1 << 31), 1 << 40]),
    st.integers(-(1 << 63), (1 << 63) - 1),
)
record_pieces = st.one_of(varint_fields.map(encode_varint), st.binary(min_size=1, max_size=6))


@HOSTILE
@given(st.lists(record_pieces, max_size=40), codecs, st.integers(0, 8))
def test_structured_garbage_records(pieces: list[bytes], codec: Codec, count: int) -> None:
    """Varint-shaped garbage reaches deeper into the record decoder than uniform random bytes."""
    body = b"".join(pieces)
    if codec is Codec.ZSTD:
        body = zstandard.ZstdCompressor().compress(body)
    elif codec is Codec.LZ4:
        body = lz4.frame.compress(body)
    every_decoder(frame(body, record_count=count, last_offset_delta=count + 2, codec=codec))


@HOSTILE
@given(st.sampled_from([SMALL, *MIXED]), st.data())
def test_a_bit_flip_anywhere_is_caught(batch: bytes, data: st.DataObject) -> None:
    bit = data.draw(st.integers(0, len(batch) * 8 - 1))
    flipped = bytearray(batch)
    flipped[bit // 8] ^= 1 << (bit % 8)
    byte = bit // 8
    if byte < 8 or LEADER_EPOCH_POS <= byte < LEADER_EPOCH_POS + 4:
        # base offset and leader epoch sit outside the CRC by design (the leader rewrites them in place)
        header = check_batch(flipped)
        assert (header.base_offset, header.leader_epoch) != (parse_header(batch).base_offset, 0)
        return
    with pytest.raises(CorruptBatchError):
        check_batch(flipped)
    with pytest.raises(CorruptBatchError):
        list(records_of(flipped))
    every_decoder(bytes(flipped))


@HOSTILE
@given(st.sampled_from([SMALL, *MIXED]), st.data())
def test_bit_flips_behind_a_resealed_crc(batch: bytes, data: st.DataObject) -> None:
    """The producer's own CRC vouches for damaged records: the decoder must still refuse them cleanly."""
    flipped = bytearray(batch)
    for _ in range(data.draw(st.integers(1, 4))):
        bit = data.draw(st.integers(CRC_START * 8, len(batch) * 8 - 1))
        flipped[bit // 8] ^= 1 << (bit % 8)
    every_decoder(bytes(reseal(flipped)))


@HOSTILE
@given(st.sampled_from([SMALL, *MIXED]), st.integers(-(1 << 31), (1 << 31) - 1), st.booleans())
def test_wrong_batch_lengths(batch: bytes, length: int, resealed: bool) -> None:
    assume(length != len(batch) - LENGTH_FIELD_END)
    buf = bytearray(batch + b"\x00" * 64)
    struct.pack_into(">i", buf, BATCH_LENGTH_POS, length)
    if resealed:
        reseal(buf)
    else:
        with pytest.raises(CorruptBatchError):
            check_batch(bytes(buf[: len(batch)]))
    every_decoder(bytes(buf))


@HOSTILE
@given(
    st.sampled_from([SMALL, *MIXED]),
    st.integers(-(1 << 31), (1 << 31) - 1),
    st.integers(-(1 << 31), (1 << 31) - 1),
)
def test_absurd_record_counts(batch: bytes, count: int, delta: int) -> None:
    buf = bytearray(batch)
    struct.pack_into(">i", buf, RECORD_COUNT_POS, count)
    struct.pack_into(">i", buf, LAST_OFFSET_DELTA_POS, delta)
    every_decoder(bytes(reseal(buf)))


@pytest.mark.parametrize("attributes", [1, 2, 5, 6, 7, -1, 0x7FF8 | 7])
def test_unknown_codecs_are_refused(attributes: int) -> None:
    buf = bytearray(SMALL)
    struct.pack_into(">h", buf, ATTRIBUTES_POS, attributes)
    with pytest.raises(CorruptBatchError, match="codec"):
        check_batch(reseal(buf))


def test_unknown_format_version_is_refused() -> None:
    buf = bytearray(SMALL)
    buf[FORMAT_VERSION_POS] = 2
    with pytest.raises(CorruptBatchError, match="format version"):
        check_batch(buf)


def test_more_records_than_offsets_is_refused() -> None:
    buf = frame(raw_record(0) + raw_record(1), record_count=2, last_offset_delta=0)
    with pytest.raises(CorruptBatchError, match="cannot span"):
        check_batch(buf)


@pytest.mark.parametrize(
    ("records", "match"),
    [
        ([raw_record(1), raw_record(0)], "out of order"),
        ([raw_record(0), raw_record(0)], "out of order"),
        ([raw_record(5)], "outside the batch"),
        ([raw_record(-1)], "outside the batch"),
        ([raw_record(0) + b"\x00"], "stray bytes"),
        ([raw_record(0, headers=[(b"\xff\xfe", b"x")])], "UTF-8"),
        ([raw_record(0)[:-1]], "impossible"),
    ],
)
def test_malformed_records_behind_a_valid_crc(records: list[bytes], match: str) -> None:
    buf = frame(b"".join(records), record_count=len(records), last_offset_delta=3)
    check_batch(buf)  # the header and CRC are fine
    with pytest.raises(CorruptBatchError, match=match):
        decode_records(buf)


def test_offset_gaps_within_a_batch_are_allowed() -> None:
    """Compaction leaves gaps: deltas need only increase."""
    buf = frame(raw_record(0) + raw_record(2) + raw_record(7), record_count=3, last_offset_delta=9, base_offset=50)
    assert [r.offset for r in decode_records(buf)] == [50, 52, 57]


# --------------------------------------------------------------------------------------------- compression bombs


def zstd_stream(total: int, *, declare_size: bool) -> bytes:
    """``total`` zero bytes compressed in pieces, so the bomb is built without ever holding ``total`` bytes."""
    compressor = zstandard.ZstdCompressor(write_content_size=declare_size)
    obj = compressor.compressobj(size=total if declare_size else -1)
    piece = b"\x00" * MiB
    parts = [obj.compress(piece) for _ in range(total // MiB)]
    return b"".join(parts) + obj.flush()


def lz4_stream(total: int) -> bytes:
    compressor = lz4.frame.LZ4FrameCompressor()
    parts: list[bytes] = [compressor.begin()]
    piece = b"\x00" * MiB
    parts += [compressor.compress(piece) for _ in range(total // MiB)]
    return b"".join(parts) + bytes(compressor.flush())


BOMBS = {
    "zstd-declared": (Codec.ZSTD, zstd_stream(100 * MiB, declare_size=True)),
    "zstd-unsized": (Codec.ZSTD, zstd_stream(100 * MiB, declare_size=False)),
    "lz4": (Codec.LZ4, lz4_stream(100 * MiB)),
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_compression_bombs_stop_at_the_default_limit(name: str) -> None:
    codec, body = BOMBS[name]
    assert len(body) < MiB  # 100 MiB of zeros in a small frame
    buf = frame(body, record_count=1, codec=codec)
    check_batch(buf)
    with peak_allocation() as peak, pytest.raises(CorruptBatchError, match="limit"):
        decode_records(buf)
    assert peak[0] < 64 * MiB + 2 * MiB  # never more than the limit plus one step


@pytest.mark.parametrize("name", list(BOMBS))
def test_compression_bombs_stop_at_a_small_limit(name: str) -> None:
    codec, body = BOMBS[name]
    buf = frame(body, record_count=1, codec=codec)
    with peak_allocation() as peak, pytest.raises(CorruptBatchError, match="limit"):
        decode_records(buf, max_uncompressed=256 * 1024)
    assert peak[0] < 2 * MiB


def test_zstd_frame_that_lies_about_its_size_is_refused() -> None:
    """A frame declaring 1 000 bytes but holding 8 MiB: zstd refuses it; we allocate only what was declared."""
    body = bytearray(zstd_stream(8 * MiB, declare_size=True))
    descriptor = body[4]
    assert descriptor >> 6 == 2 and not descriptor & 0x20 and not descriptor & 0x03  # 4-byte size after the window
    struct.pack_into("<I", body, 6, 1000)
    assert zstandard.frame_content_size(bytes(body)) == 1000
    buf = frame(bytes(body), record_count=1, codec=Codec.ZSTD)
    with peak_allocation() as peak, pytest.raises(CorruptBatchError):
        decode_records(buf)
    assert peak[0] < MiB


@pytest.mark.parametrize("codec", [Codec.ZSTD, Codec.LZ4])
def test_just_under_the_limit_decodes(codec: Codec) -> None:
    value = b"\x07" * (300 * 1024)
    buf = build_batch([NewRecord(value)], timestamp=NOW, codec=codec)
    assert decode_records(buf, max_uncompressed=301 * 1024)[0].value == value
    with pytest.raises(CorruptBatchError, match="limit"):
        decode_records(buf, max_uncompressed=299 * 1024)


def test_truncated_lz4_frame_is_refused() -> None:
    body = lz4.frame.compress(bytes(range(256)) * 1000)
    with pytest.raises(CorruptBatchError):
        decode_records(frame(body[: len(body) // 2], record_count=1, codec=Codec.LZ4))


# --------------------------------------------------------------------------------------------- allocation bounds


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([SMALL, *MIXED]),
    st.integers(-(1 << 31), (1 << 31) - 1),
    st.integers(-(1 << 31), (1 << 31) - 1),
    st.lists(record_pieces, max_size=30),
)
def test_decoding_allocates_in_proportion_to_the_input(batch: bytes, count: int, delta: int, tail: list[bytes]) -> None:
    """Claimed counts and lengths never drive allocation: only the bytes present (and the limit) do."""
    buf = bytearray(batch[:HEADER_SIZE] + b"".join(tail)) if tail else bytearray(batch)
    struct.pack_into(">i", buf, BATCH_LENGTH_POS, len(buf) - LENGTH_FIELD_END)
    struct.pack_into(">i", buf, RECORD_COUNT_POS, count)
    struct.pack_into(">i", buf, LAST_OFFSET_DELTA_POS, delta)
    reseal(buf)
    limit = 64 * 1024
    with peak_allocation() as peak:
        every_decoder(bytes(buf), limit=limit)
    # Record objects cost a few dozen bytes for every byte of record they decode.
    assert peak[0] < 64 * (len(buf) + limit) + 256 * 1024


def test_crc_ok_reports_without_raising() -> None:
    header = parse_header(SMALL)
    assert crc_ok(SMALL, 0, header)
    damaged = bytearray(SMALL)
    damaged[-1] ^= 1
    assert not crc_ok(damaged, 0, header)
