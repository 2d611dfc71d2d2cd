"""Checking streamed records: the full scan agrees with the batch decoder, and the quick count refuses what
does not frame."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.storage.batch import BatchBuilder, CorruptBatchError, NewRecord, build_batch, decode_records
from tidelog.storage.record_scan import count_records, scan_records

record = st.builds(
    NewRecord,
    st.none() | st.binary(max_size=300),
    st.none() | st.binary(max_size=20),
    st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=5)), max_size=3),
    st.none() | st.integers(0, 2**40),
)


def encoded(records: list[NewRecord], first_timestamp: int = 10**12) -> bytes:
    builder = BatchBuilder(first_timestamp)
    for r in records:
        builder.append(r.value, r.key, r.headers, r.timestamp)
    return builder.drain()


@given(st.lists(record, min_size=1, max_size=20))
def test_scan_and_count_agree_with_the_decoder(records: list[NewRecord]) -> None:
    first = 10**12
    data = encoded(records, first)
    scanned = scan_records(data, 0)
    assert scanned.records == count_records(data) == len(records)
    decoded = decode_records(build_batch(records, timestamp=first))
    assert scanned.max_timestamp_delta == max(0, max(r.timestamp for r in decoded) - first)


def test_offset_deltas_must_continue_the_previous_chunk() -> None:
    data = encoded([NewRecord(b"a"), NewRecord(b"b")])
    assert scan_records(data, 0).records == 2
    with pytest.raises(CorruptBatchError, match="offset delta 0, expected 5"):
        scan_records(data, 5)


@pytest.mark.parametrize("cut", [1, 3, 10])
def test_a_cut_chunk_is_refused_by_both(cut: int) -> None:
    data = encoded([NewRecord(b"x" * 50), NewRecord(b"y" * 50)])
    with pytest.raises(CorruptBatchError):
        scan_records(data[:-cut], 0)
    with pytest.raises(CorruptBatchError):
        count_records(data[:-cut])


def test_every_single_byte_damage_is_caught_or_still_decodes() -> None:
    """The scan refuses a damaged chunk or accepts one the batch decoder accepts too (never less strict)."""
    data = encoded([NewRecord(b"v1", key=b"k", headers=[("h", b"1")]), NewRecord(b"v2")])
    for position in range(len(data)):
        for flip in (0x01, 0x80, 0xFF):
            damaged = bytearray(data)
            damaged[position] ^= flip
            try:
                scanned = scan_records(bytes(damaged), 0)
            except CorruptBatchError:
                continue
            builder_records = decode_records(_as_batch(bytes(damaged), scanned.records))
            assert len(builder_records) == scanned.records


def _as_batch(section: bytes, count: int) -> bytes:
    from tidelog.storage.batch import _frame

    return _frame(
        section,
        base_offset=0,
        leader_epoch=0,
        attributes=0,
        last_offset_delta=count - 1,
        first_timestamp=10**12,
        max_timestamp=10**12,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        record_count=count,
    )
