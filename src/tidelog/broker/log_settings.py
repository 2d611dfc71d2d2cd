"""A partition log's settings: the stream's own overrides over the broker's defaults.

The broker's configuration holds the defaults (``segment_max_bytes``, ``retention_max_age_ms``, ...); a stream's
record may override each one. :func:`log_config_for` is the one place that combines them into the
:class:`~tidelog.storage.config.LogConfig` a partition's log opens with.
"""

from __future__ import annotations

from tidelog.broker.config import BrokerConfig
from tidelog.metadata.records import StreamRecord
from tidelog.storage.config import FlushPolicy, LogConfig

__all__ = ["log_config_for"]


def log_config_for(config: BrokerConfig, stream: StreamRecord) -> LogConfig:
    """A stream's log settings: its own overrides over the broker's defaults (0 in a limit means none)."""
    o = stream.config

    def pick(override: int | None, default: int) -> int:
        return default if override is None else override

    def limit(override: int | None, default: int) -> int | None:
        value = pick(override, default)
        return value or None

    segment_max_bytes = pick(o.segment_max_bytes, config.segment_max_bytes)
    return LogConfig(
        segment_max_bytes=segment_max_bytes,
        segment_max_age_ms=pick(o.segment_max_age_ms, config.segment_max_age_ms) or 2**62 // 1_000_000,
        flush_policy=FlushPolicy(o.flush_policy or config.default_flush_policy),
        flush_interval_ms=pick(o.flush_interval_ms, config.default_flush_interval_ms),
        preallocate_bytes=min(config.segment_preallocate_bytes, segment_max_bytes),
        max_batch_bytes=min(segment_max_bytes, max(4 * 1024 * 1024, config.max_message_bytes * 2)),
        retention_max_bytes=limit(o.retention_max_bytes, config.retention_max_bytes),
        retention_max_age_ms=limit(o.retention_max_age_ms, config.retention_max_age_ms),
        retention_max_messages=limit(o.retention_max_messages, config.retention_max_messages),
        compact=bool(config.compact_enabled if o.compact_enabled is None else o.compact_enabled),
        delete_retention_ms=config.compact_delete_retention_ms,
        compact_min_lag_ms=pick(o.compact_min_lag_ms, config.compact_min_lag_ms),
        compact_workers=pick(o.compact_max_goroutines, config.compact_max_goroutines),
        cleaner_interval_ms=o.cleaner_interval_ms,
    )
