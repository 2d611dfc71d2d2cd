"""Planning on the driver: offsets as Spark checkpoints them, admission control, and offset ranges as tasks.

Offsets. Spark stores a streaming source's offsets as JSON in the checkpoint and hands them back; the
``tidelog`` source uses Kafka's layout, ``{"orders": {"0": 1200, "1": 1175}}``: per stream and partition, the
next offset to read (everything below it was read). :func:`to_json` writes streams and partitions sorted, so
equal offsets are equal JSON (Spark compares offsets to decide whether a micro-batch has data).

Admission control (``maxOffsetsPerTrigger``). :func:`admit` moves each partition's end towards its high
watermark by its share of the limit, in proportion to its lag (Kafka's rule), with the largest-remainder method
so that the shares add up to exactly the limit (never more: Kafka's rounding up can exceed it) and a partition
with any lag gets its turn. Offsets after compaction may have gaps, so a range of ``n`` offsets holds at most
``n`` records: the bound holds for records too.

Tasks. Each partition's range ``[start, end)`` becomes one :class:`OffsetRange`, a Spark input partition, or
several when :func:`split` cuts it: into pieces of at most ``maxOffsetsPerSplit`` offsets, and, when
``minPartitions`` asks for more tasks than that gives, the largest ranges into more pieces, in proportion to
their size. A task reads its range with one consumer fetching from the partition's leader, or, for offsets in the
tiered store, from the store itself (:func:`tidelog.spark.remote.plan_remote` plans those tasks); with
``readFrom``, from an in-sync follower (:func:`tidelog.spark.replicas.assign`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from pyspark.sql.datasource import InputPartition

from tidelog.spark.options import SourceOptionError
from tidelog.storage.remote_segment import RemoteSegment

TopicPartition = tuple[str, int]
Offsets = dict[TopicPartition, int]


@dataclass(frozen=True, slots=True)
class Bounds:
    """A partition's readable offsets when asked: ``[log_start, high_watermark)``, exclusive as everywhere."""

    log_start: int
    high_watermark: int


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """One Spark task's work: the offsets ``[start, end)`` of one partition. ``subject`` is the partition's own
    NATS subject (the ``subject`` column of records that carry none). ``segments``: the offloaded segments holding
    the range, which the task reads straight from the tiered store (:mod:`tidelog.spark.remote`); empty: it
    reads through the partition's leader, or through ``replica``, an in-sync follower (``readFrom``,
    :mod:`tidelog.spark.replicas`)."""

    stream: str
    partition: int
    start: int
    end: int
    subject: str
    segments: tuple[RemoteSegment, ...] = ()
    replica: str | None = None

    @property
    def size(self) -> int:
        return self.end - self.start


def to_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """``{(stream, partition): offset}`` → Spark's offset document, sorted by stream and partition."""
    out: dict[str, dict[str, int]] = {}
    for (stream, partition), offset in sorted(offsets.items()):
        out.setdefault(stream, {})[str(partition)] = offset
    return out


def from_json(document: Mapping[str, Any]) -> Offsets:
    """Spark's offset document → ``{(stream, partition): offset}``; refuses a document this source did not write
    (a checkpoint of another source)."""
    out: Offsets = {}
    for stream, partitions in document.items():
        if not isinstance(partitions, Mapping):
            raise ValueError(f"offsets of stream {stream!r} are not an object: {document!r}")
        for partition, offset in partitions.items():
            if not str(partition).isdigit() or not isinstance(offset, int) or offset < 0:
                raise ValueError(f"not a tidelog offset: {stream}/{partition} = {offset!r}")
            out[(stream, int(partition))] = offset
    return out


def waits(
    start: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    min_offsets: int | None,
    waited_ms: float,
    max_delay_ms: int,
) -> bool:
    """``minOffsetsPerTrigger``: whether a trigger should wait for more — fewer than ``min_offsets`` new offsets
    from ``start`` to ``latest`` and less than ``max_delay_ms`` since the last micro-batch (Kafka's rule)."""
    if min_offsets is None or waited_ms >= max_delay_ms:
        return False
    available = sum(max(0, end - start.get(tp, 0)) for tp, end in latest.items())
    return available < min_offsets


def admit(start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int], limit: int) -> Offsets:
    """The end offsets of a micro-batch reading at most ``limit`` offsets from ``start`` towards ``latest``.

    Partitions in ``latest`` but not in ``start`` start at 0 here (new ones: :func:`plan` reads them from their
    log start); none ends below its start.
    """
    lags = {tp: max(0, end - start.get(tp, 0)) for tp, end in latest.items()}
    total = sum(lags.values())
    if total <= limit:
        return {tp: start.get(tp, 0) + lag for tp, lag in lags.items()}
    shares = {tp: lag * limit // total for tp, lag in lags.items()}
    left = limit - sum(shares.values())
    # The remainders, largest first (ties: the longest lag, then name order), each worth one more offset.
    by_remainder = sorted(lags, key=lambda tp: (-(lags[tp] * limit % total), -lags[tp], tp))
    for tp in by_remainder[:left]:
        shares[tp] += 1
    return {tp: start.get(tp, 0) + shares[tp] for tp in latest}


def split(ranges: Sequence[OffsetRange], *, max_offsets: int, min_partitions: int | None) -> list[OffsetRange]:
    """Cut ``ranges`` into tasks: each at most ``max_offsets`` offsets, and at least ``min_partitions`` tasks in
    all when the offsets allow it (a range is never cut below one offset per task)."""
    pieces = {i: max(1, math.ceil(r.size / max_offsets)) for i, r in enumerate(ranges)}
    want = min_partitions or 0
    total_size = sum(r.size for r in ranges)
    if sum(pieces.values()) < want and total_size > 0:
        # Kafka's minPartitions: each range gets tasks in proportion to its share of all offsets.
        for i, r in enumerate(ranges):
            pieces[i] = max(pieces[i], min(r.size, math.ceil(r.size * want / total_size)))
    out: list[OffsetRange] = []
    for i, r in enumerate(ranges):
        count = pieces[i]
        bounds = [r.start + r.size * j // count for j in range(count + 1)]
        out += [OffsetRange(r.stream, r.partition, lo, hi, r.subject) for lo, hi in pairwise(bounds) if hi > lo]
    return out


def check_ranges(start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int]) -> None:
    """A batch read's ending offsets may not lie before its starting ones."""
    for tp, stop in end.items():
        if stop < start[tp]:
            stream, partition = tp
            raise SourceOptionError(
                "endingOffsets", f"{stream}/{partition} ends at {stop}, before its starting offset {start[tp]}"
            )
