"""Settings of one partition log: when segments roll, how often data is flushed, what retention keeps.

One small immutable object (Kafka's ``LogConfig``) rather than loose arguments, so a stream's settings can be
passed around, compared and replaced as a whole. Everything is validated at construction: a bad value is a
configuration error that should stop a stream from being created, not a surprise at the first append.

What each flush policy survives:

- ``ALWAYS`` — an append is acknowledged only after an fsync covers it (concurrent appends share one fsync:
  group commit). Survives a process crash and a machine crash or power loss.
- ``INTERVAL`` — a background task fsyncs every ``flush_interval_ms``. Survives a process crash (the data is in
  the page cache); a machine crash may lose up to the last interval of acknowledged appends.
- ``NEVER`` — the operating system writes back when it likes. Survives a process crash; a machine crash may
  lose anything not yet written back. Durability then comes from replication alone (Kafka's and Liftbridge's
  default).

In every case recovery leaves a clean prefix: a torn or corrupt tail is cut, never served.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tidelog.protocol.records import HEADER_SIZE

MiB = 1024 * 1024
DAY_MS = 24 * 60 * 60 * 1000

#: Positions in a segment are stored as unsigned 32-bit integers in the offset index; staying below 2 GiB
#: keeps them clear of any signed reading of the same field.
MAX_SEGMENT_BYTES = 2**31 - 1
MAX_COMPACT_WORKERS = 64  # worker threads one compaction may use


class FlushPolicy(enum.Enum):
    """When appended data is forced to stable storage (see the module docstring for what each survives)."""

    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Roll, index, flush, retention and compaction settings of a log.

    ``None`` in a retention field means "no limit of this kind". Retention keeps at least the configured
    amount (Kafka's rule): a sealed segment is deleted only when what remains still meets the limit.
    """

    segment_max_bytes: int = 128 * MiB
    """Roll to a new segment before an append would make the active one larger than this."""
    segment_max_age_ms: int = 7 * DAY_MS
    """Roll a non-empty active segment once its first append is this old (after a restart, the age counts
    from the first batch's timestamp, as in Kafka, so restarts do not postpone rolling forever)."""
    index_interval_bytes: int = 4096
    """About this many log bytes between sparse index entries: the most a lookup has to scan."""
    flush_policy: FlushPolicy = FlushPolicy.ALWAYS
    flush_interval_ms: int = 1000
    """Period of the background fsync under ``FlushPolicy.INTERVAL``."""
    preallocate_bytes: int = 4 * MiB
    """Under ``FlushPolicy.ALWAYS``, zeros written ahead of the active segment's end (in the background), so
    that each fsynced append overwrites allocated blocks instead of growing the file (see
    :mod:`tidelog.storage.preallocation`). 0 turns it off; ignored under the other policies."""
    max_batch_bytes: int = 4 * MiB
    """Largest single record batch an append accepts (``segment_max_bytes`` too, if that is smaller: a batch
    never spans segments)."""
    retention_max_bytes: int | None = None
    retention_max_age_ms: int | None = None
    retention_max_messages: int | None = None
    compact: bool = False
    """Key compaction of sealed segments below the high watermark, in addition to retention. The log does
    not schedule it: whoever owns the partition calls ``Log.compact`` when this is set."""
    delete_retention_ms: int = 1 * DAY_MS
    """How long compaction keeps a tombstone, so that readers catching up still see the delete."""
    compact_min_lag_ms: int = 0
    """A record whose timestamp is younger than this is never removed by compaction (Kafka's
    ``min.compaction.lag.ms``), so a consumer lagging by less than this sees every record. 0: no lag."""
    compact_workers: int = 1
    """Segment files one compaction of this log rewrites at the same time, each in its own worker thread
    (Liftbridge's ``compactMaxGoroutines``)."""
    cleaner_interval_ms: int | None = None
    """How often retention and compaction run on this log; ``None``: the cleaner's own interval."""

    def __post_init__(self) -> None:
        _require_int("segment_max_bytes", self.segment_max_bytes, HEADER_SIZE, MAX_SEGMENT_BYTES)
        _require_int("segment_max_age_ms", self.segment_max_age_ms, 1, None)
        _require_int("index_interval_bytes", self.index_interval_bytes, 1, MAX_SEGMENT_BYTES)
        if not isinstance(self.flush_policy, FlushPolicy):
            allowed = ", ".join(p.name for p in FlushPolicy)
            raise ValueError(f"flush_policy must be a FlushPolicy ({allowed}), got {self.flush_policy!r}")
        _require_int("flush_interval_ms", self.flush_interval_ms, 1, None)
        _require_int("preallocate_bytes", self.preallocate_bytes, 0, MAX_SEGMENT_BYTES)
        _require_int("max_batch_bytes", self.max_batch_bytes, HEADER_SIZE, None)
        for name in ("retention_max_bytes", "retention_max_age_ms", "retention_max_messages"):
            value = getattr(self, name)
            if value is not None:
                _require_int(name, value, 0, None, none_ok=True)
        if not isinstance(self.compact, bool):
            raise ValueError(f"compact must be True or False, got {self.compact!r}")
        _require_int("delete_retention_ms", self.delete_retention_ms, 0, None)
        _require_int("compact_min_lag_ms", self.compact_min_lag_ms, 0, None)
        _require_int("compact_workers", self.compact_workers, 1, MAX_COMPACT_WORKERS)
        if self.cleaner_interval_ms is not None:
            _require_int("cleaner_interval_ms", self.cleaner_interval_ms, 1, None)

    @property
    def segment_max_age_ns(self) -> int:
        return self.segment_max_age_ms * 1_000_000


def _require_int(name: str, value: object, low: int, high: int | None, *, none_ok: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "an integer or None" if none_ok else "an integer"
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"at least {low}" if high is None else f"between {low} and {high}"
        raise ValueError(f"{name} must be {bound}, got {value}")
