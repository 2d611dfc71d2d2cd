"""Every decoder of the record format agrees with the canonical one on every record shape and codec.

The canonical decoder is :func:`~tidelog.protocol.records.decode_records`. The others are fast paths over the same
bytes, each with its own output: the consumer's rows (:mod:`tidelog.protocol.records.rows`), the Spark source's
Arrow columns (:mod:`tidelog.spark.columns`, when pyarrow is importable) and the produce-time validator's verdict
(:mod:`tidelog.protocol.records.check`: it accepts the batch, counts its records and bounds their timestamp
deltas). The shapes are chosen to start runs of alike records and break them in every way, and hypothesis adds
arbitrary records.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.client.records import batches_of
from tidelog.protocol.records import (
    BatchBuilder,
    Codec,
    NewRecord,
    Record,
    build_batch,
    check_records,
    decode_records,
    parse_header,
    rebuild_batch,
    record_section,
)

NOW = 1_700_000_000_000_000_000
HAVE_ARROW = importlib.util.find_spec("pyarrow") is not None
Decoded = list[tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]]


def canonical(batch: bytes) -> Decoded:
    return [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decode_records(batch)]


def rows(batch: bytes) -> Decoded:
    (fetched,) = batches_of(memoryview(batch), "s", 0, 0)
    return [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in fetched.records()]


def spark_columns(batch: bytes) -> Decoded:
    """What the Spark decoder built, in the canonical decoder's terms (its timestamps are µs, so compared as such
    by :func:`in_spark_terms`)."""
    import pyarrow as pa

    from tidelog.spark.columns import ColumnBuilder

    (fetched,) = batches_of(memoryview(batch), "s", 0, 0)
    builder = ColumnBuilder("s", 0, "subject", include_headers=True)
    builder.add(fetched, 1 << 62)
    result = builder.build()
    micros = result.column("timestamp").cast(pa.int64()).to_pylist()
    headers = [tuple((h["key"], h["value"]) for h in hs) for hs in result.column("headers").to_pylist()]
    return list(
        zip(
            result.column("offset").to_pylist(),
            micros,
            result.column("key").to_pylist(),
            result.column("value").to_pylist(),
            headers,
            strict=True,
        )
    )


def in_spark_terms(decoded: Decoded) -> Decoded:
    return [(offset, ts // 1000, key, value, headers) for offset, ts, key, value, headers in decoded]


def verdict(batch: bytes) -> tuple[int, int, int]:
    header = parse_header(batch)
    checked = check_records(record_section(batch, 0, header=header), 0, 1 << 40)
    return checked.records, checked.min_timestamp_delta, checked.max_timestamp_delta


def expected_verdict(batch: bytes, records: Sequence[Record]) -> tuple[int, int, int]:
    first = parse_header(batch).first_timestamp
    deltas = [r.timestamp - first for r in records]
    return len(records), min(deltas), max(deltas)


def agree(batch: bytes) -> None:
    """Every decoder reads ``batch`` as the canonical decoder does."""
    want = canonical(batch)
    assert rows(batch) == want
    if HAVE_ARROW:
        assert spark_columns(batch) == in_spark_terms(want)
    records = decode_records(batch)
    header = parse_header(batch)
    if header.record_count == header.last_offset_delta + 1:  # the validator takes produced batches: dense offsets
        assert verdict(batch) == expected_verdict(batch, records)


def producer(count: int, size: int, step: int = 1500, start: int = NOW) -> list[NewRecord]:
    return [NewRecord(bytes([i % 251]) * size, timestamp=start + i * step) for i in range(count)]


SHAPES: dict[str, Callable[[], list[NewRecord]]] = {
    "producer": lambda: producer(600, 100),
    "producer-1KiB": lambda: producer(300, 1024),
    "keyed": lambda: [NewRecord(b"v" * 50, key=b"k%03d" % (i % 1000), timestamp=NOW + i) for i in range(200)],
    "null-key-and-value": lambda: [NewRecord(None, timestamp=NOW + i) for i in range(100)],
    "tombstones-in-a-run": lambda: [
        NewRecord(None if i % 37 == 5 else b"x" * 30, key=b"key", timestamp=NOW + i) for i in range(200)
    ],
    "empty-values": lambda: [NewRecord(b"", timestamp=NOW + i) for i in range(100)],
    "empty-keys": lambda: [NewRecord(b"v", key=b"", timestamp=NOW + i) for i in range(100)],
    "one-header": lambda: [NewRecord(b"v", headers=[("h", b"1")], timestamp=NOW + i) for i in range(50)],
    "many-headers": lambda: [
        NewRecord(b"v", headers=[(f"h{j}", bytes(j)) for j in range(6)], timestamp=NOW) for _ in range(40)
    ],
    "header-empty-value": lambda: [NewRecord(b"v", headers=[("h", b"")]) for _ in range(30)],
    "headers-break-a-run": lambda: [
        NewRecord(b"v" * 20, headers=[("h", b"x")] if i == 150 else [], timestamp=NOW + i) for i in range(300)
    ],
    "timestamps-equal": lambda: producer(200, 10, step=0),
    "timestamps-decreasing": lambda: producer(200, 10, step=-1000),
    "timestamps-negative": lambda: producer(200, 10, step=7, start=-(10**12)),
    "timestamps-unset": lambda: [NewRecord(b"v" * 10) for _ in range(100)],
    "timestamp-jump-mid-run": lambda: [
        NewRecord(b"v" * 10, timestamp=NOW + (10**9 if i >= 100 else 0) + i) for i in range(200)
    ],
    "size-changes-mid-run": lambda: [NewRecord(b"v" * (10 if i < 120 else 11), timestamp=NOW + i) for i in range(240)],
    "key-appears-mid-run": lambda: [
        NewRecord(b"v" * 10, key=b"k" if i == 77 else None, timestamp=NOW + i) for i in range(200)
    ],
    "large-values": lambda: [NewRecord(bytes(20_000), key=bytes(200), timestamp=NOW + i) for i in range(60)],
    "offset-deltas-past-8191": lambda: producer(9000, 1, step=1),
}


def build(records: Sequence[NewRecord], codec: Codec) -> bytes:
    builder = BatchBuilder(NOW if records[0].timestamp is None else records[0].timestamp)
    for r in records:
        builder.append(r.value, r.key, r.headers, r.timestamp)
    return builder.build(codec=codec, base_offset=1000)


@pytest.mark.parametrize("codec", list(Codec), ids=lambda c: c.name)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_decoder_agrees_with_the_canonical_one(shape: str, codec: Codec) -> None:
    agree(build(SHAPES[shape](), codec))


@pytest.mark.parametrize("codec", list(Codec), ids=lambda c: c.name)
@pytest.mark.parametrize("keep", [lambda i: i % 3 != 1, lambda i: i < 40 or i > 90], ids=["every-third", "a-gap"])
def test_compacted_batches_with_offset_gaps(codec: Codec, keep: Callable[[int], bool]) -> None:
    batch = build_batch(producer(200, 16), timestamp=NOW, codec=codec)
    header = parse_header(batch)
    agree(rebuild_batch(header, [r for i, r in enumerate(decode_records(batch)) if keep(i)]))


blobs = st.none() | st.binary(max_size=300)
header_lists = st.lists(st.tuples(st.sampled_from(["a", "b", "ü", ""]), st.binary(max_size=20)), max_size=3)
timestamps = st.none() | st.integers(min_value=-(1 << 60), max_value=1 << 62)
record_lists = st.lists(
    st.builds(NewRecord, value=blobs, key=blobs, headers=header_lists, timestamp=timestamps), min_size=1, max_size=80
)


@settings(max_examples=150, deadline=None)
@given(records=record_lists, codec=st.sampled_from(list(Codec)), repeat=st.integers(min_value=1, max_value=40))
def test_arbitrary_records(records: list[NewRecord], codec: Codec, repeat: int) -> None:
    agree(build((records * repeat)[:2000], codec))
