"""What the consumer hands out: fetched batches, and records decoded from them on demand.

A fetch response's payload is whole record batches exactly as stored. :func:`batches_of` cuts it into
:class:`FetchedBatch` views (per-batch work: a header parse and a hardware CRC), and nothing is decoded until a
caller asks a batch for its records. Counting records, measuring throughput or forwarding batches elsewhere
therefore costs nothing per record.

The first batch of a response may begin before the offset that was asked for (a fetch returns the whole batch
holding the offset); a batch knows the consumer's position when it was fetched (``start``) and its records and
counts leave out what lies before it, so nothing is delivered twice.

Decoding is the consumer's per-record hot path: a batch's records are parsed by the row decoder of the record
format package, :func:`tidelog.protocol.records.rows.parse_records`, from its record section (decompressed first
when the batch is compressed: :func:`~tidelog.protocol.records.record_section`).
"""

from __future__ import annotations

import contextlib

from tidelog.protocol.records import BatchHeader, iter_batches, record_section
from tidelog.protocol.records.errors import CorruptBatchError
from tidelog.protocol.records.rows import ConsumerRecord, parse_records


class FetchedBatch:
    """One record batch of a partition, as fetched; records are decoded only when asked for."""

    __slots__ = ("data", "header", "partition", "start", "stream")

    def __init__(self, stream: str, partition: int, header: BatchHeader, data: memoryview, start: int) -> None:
        self.stream = stream
        self.partition = partition
        self.header = header
        self.data = data  # the whole batch, header included: a view into the response
        self.start = start  # records below this offset were delivered before

    @property
    def base_offset(self) -> int:
        return self.header.base_offset

    @property
    def next_offset(self) -> int:
        """The offset after the batch's last one: where reading continues."""
        return self.header.next_offset

    @property
    def record_count(self) -> int:
        """Records of this batch at or after ``start``; decodes only a batch that straddles ``start`` and was
        compacted (its offsets are not dense)."""
        header = self.header
        if header.base_offset >= self.start:
            return header.record_count
        if header.record_count == header.last_offset_delta + 1:
            return max(0, header.next_offset - self.start)
        return len(self.records())

    def records(self) -> list[ConsumerRecord]:
        """The decoded records at or after ``start``, in offset order."""
        header = self.header
        section = record_section(self.data, 0, header=header)
        records = parse_records(
            section if isinstance(section, bytes) else bytes(section), header, self.stream, self.partition
        )
        if header.base_offset < self.start:
            return [r for r in records if r.offset >= self.start]
        return records

    def __repr__(self) -> str:
        h = self.header
        offsets = f"{h.base_offset}..{h.last_offset}"
        return f"FetchedBatch({self.stream}/{self.partition}, offsets={offsets}, records={h.record_count})"


def batches_of(
    payload: memoryview, stream: str, partition: int, start: int, *, verify: bool = True
) -> list[FetchedBatch]:
    """Cut a fetch payload into batches, checking each one's CRC when ``verify`` (raises ``CorruptBatchError``)."""
    return [
        FetchedBatch(stream, partition, header, payload[position : position + header.size], start)
        for position, header in iter_batches(payload, verify=verify)
        if header.next_offset > start
    ]


def batches_before_corruption(payload: memoryview, stream: str, partition: int, start: int) -> list[FetchedBatch]:
    """The batches of a fetch payload that precede its first torn or CRC-failing batch (after
    :func:`batches_of` raised): what can still be delivered before the damage."""
    good: list[FetchedBatch] = []
    with contextlib.suppress(CorruptBatchError):
        for position, header in iter_batches(payload, verify=True):
            if header.next_offset > start:
                good.append(FetchedBatch(stream, partition, header, payload[position : position + header.size], start))
    return good
