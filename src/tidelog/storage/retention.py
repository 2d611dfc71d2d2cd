"""Retention: which whole sealed segments a log may delete, by age, total bytes and message count.

Retention only ever removes a *prefix* of sealed segments, so the log stays contiguous from its new start
offset; the active segment is never deleted (a log always has somewhere to append). Each limit is evaluated on
its own as "the longest prefix this limit allows to go", and the log deletes the longest of those prefixes
(Kafka applies its time and size rules one after the other, which comes to the same thing):

- **age** (``retention_max_age_ms``): a segment whose newest record is older than ``now - max_age`` goes.
  The newest record, not the oldest: a segment is kept while any of its records is still within retention.
- **bytes** (``retention_max_bytes``): the oldest segment goes while what *remains* is still at least the
  limit, so the log never shrinks below it.
- **messages** (``retention_max_messages``): likewise, counting offsets from the next segment's base to the
  log's end (offsets, not surviving records: after compaction the two differ, and offsets are what a
  consumer's position is measured in).

A caller may also cap deletion at ``max_offset`` (for instance the high watermark, so data that replication
has not yet committed is never deleted): only segments that end at or below it are eligible.

The decision (:func:`deletable_prefix`) is a pure function of segment snapshots, so it is tested without
files; :func:`apply_retention` runs it on a live log under the log's lock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tidelog.storage.config import LogConfig
from tidelog.storage.segment_state import SegmentInfo

if TYPE_CHECKING:
    from tidelog.storage.log import Log


def deletable_prefix(
    segments: Sequence[SegmentInfo],
    config: LogConfig,
    now_ns: int,
    end_offset: int,
    max_offset: int | None = None,
) -> int:
    """How many of the oldest ``segments`` (in offset order, the last one active) retention deletes."""
    sealed = len(segments) - 1
    limit = 0
    while limit < sealed and (max_offset is None or segments[limit + 1].base_offset <= max_offset):
        limit += 1
    if limit == 0:
        return 0
    counts = [0]
    if config.retention_max_age_ms is not None:
        horizon = now_ns - config.retention_max_age_ms * 1_000_000
        counts.append(_prefix(limit, lambda i: _older_than(segments[i], horizon)))
    if config.retention_max_bytes is not None:
        counts.append(_bytes_prefix(segments, limit, config.retention_max_bytes))
    if config.retention_max_messages is not None:
        keep = config.retention_max_messages
        counts.append(_prefix(limit, lambda i: end_offset - segments[i + 1].base_offset >= keep))
    return max(counts)


def _older_than(segment: SegmentInfo, horizon_ns: int) -> bool:
    return segment.max_timestamp is None or segment.max_timestamp < horizon_ns


def _prefix(limit: int, deletable: Callable[[int], bool]) -> int:
    count = 0
    while count < limit and deletable(count):
        count += 1
    return count


def _bytes_prefix(segments: Sequence[SegmentInfo], limit: int, keep_bytes: int) -> int:
    remaining = sum(s.size for s in segments)
    count = 0
    while count < limit and remaining - segments[count].size >= keep_bytes:
        remaining -= segments[count].size
        count += 1
    return count


async def apply_retention(log: Log, now_ns: int | None = None, *, max_offset: int | None = None) -> list[int]:
    """Delete what the log's retention settings allow; return the base offsets of the deleted segments."""
    return await log.apply_retention(now_ns, max_offset=max_offset)
