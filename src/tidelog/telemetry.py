"""The metrics that must be counted as things happen: request and fsync latencies, NATS messages, ISR changes.

Most of what a broker exports is *state* — offsets, high watermarks, ISRs, follower progress, group lag — and is
read at scrape time by the collectors of :mod:`tidelog.ui.collectors`, costing nothing on the write path. What
is left are events that leave no state behind: how long a request or an fsync took, how many appends one fsync
covered, how often an ISR shrank. Those are counted here, by
one-line hooks at clear seams (the wire session, the gRPC guard, the flusher, the controller), each
a few attribute lookups and one ``observe``/``inc`` of ``prometheus_client``.

This module sits at the bottom of the layers (beside :mod:`tidelog.clock`) so that storage, replication and
metadata can call it; the instruments live in their own :data:`REGISTRY`, which the broker's ``/metrics``
serves beside its scrape-time collectors. They are process-wide: one broker per process is the way tidelog runs
(several in-process brokers, as some tests start, share them). :func:`set_enabled` (``metrics_enabled = false``)
turns every hook into a test of one module global.

Names follow Prometheus conventions (``tidelog_`` prefix, base units, ``_total`` for counters, ``_seconds`` and
``_bytes`` suffixes); ``docs/configuration.md`` describes the settings.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = [
    "REGISTRY",
    "catch_up_copied",
    "enabled",
    "etcd_txn",
    "fsynced",
    "isr_changed",
    "leader_elected",
    "metadata_changed",
    "request_observer",
    "set_enabled",
    "write_committed",
    "follower_replicated",
]

REGISTRY = CollectorRegistry(auto_describe=False)
"""Every pushed instrument of this process (the per-broker state is collected at scrape time instead)."""

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

_enabled = True

_requests = Histogram(
    "tidelog_request_duration_seconds",
    "Time from reading a request to its answer, per protocol (wire, grpc) and operation.",
    ("protocol", "operation"),
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
_fsync = Histogram(
    "tidelog_fsync_duration_seconds",
    "Time of one group-commit fsync round (every dirty segment of one log).",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
_group_commit = Histogram(
    "tidelog_group_commit_appends",
    "Appends acknowledged by one fsync round (group commit: more than one under load).",
    buckets=_BATCH_BUCKETS,
    registry=REGISTRY,
)
_fsynced_bytes = Counter("tidelog_fsynced_bytes_total", "Bytes made durable by fsync rounds.", registry=REGISTRY)
_isr_shrinks = Counter(
    "tidelog_isr_shrinks_total", "ISR changes this broker's partitions made that removed a replica.", registry=REGISTRY
)
_isr_expands = Counter(
    "tidelog_isr_expands_total", "ISR changes this broker's partitions made that added a replica.", registry=REGISTRY
)
_elections = Counter(
    "tidelog_leader_elections_total",
    "Partition leaders chosen by this broker while controller, by cause (failover, balance, shutdown, ...).",
    ("cause",),
    registry=REGISTRY,
)
_metadata_changes = Counter(
    "tidelog_controller_metadata_changes_total",
    "Metadata transactions this broker committed in etcd while controller.",
    registry=REGISTRY,
)
_etcd_txn = Histogram(
    "tidelog_etcd_txn_duration_seconds",
    "Time of the controller's fenced etcd transactions.",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
_catch_up_copies = Counter(
    "tidelog_replica_catch_up_segments_total",
    "Sealed segment files this broker's followers copied from their leaders (far-horizon catch-up).",
    registry=REGISTRY,
)
_catch_up_bytes = Counter(
    "tidelog_replica_catch_up_bytes_total",
    "Bytes of sealed segment files copied by far-horizon catch-up.",
    registry=REGISTRY,
)
_apply = Histogram(
    "tidelog_apply_latency_seconds",
    "Time from a write reaching the leader to its being committed (below the high watermark), acks ALL writes.",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
_replicate = Histogram(
    "tidelog_replicate_latency_seconds",
    "Time from a write reaching the leader to a follower acknowledging it (durable on the follower): Rama's "
    "replicate latency, measured when a follower's fetch covers the leader's newest write.",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)


def set_enabled(on: bool) -> None:
    """Count (the default) or not (``metrics_enabled = false``): every hook then returns at once."""
    global _enabled
    _enabled = on


def enabled() -> bool:
    return _enabled


def _nothing(_seconds: float) -> None:
    return None


def request_observer(protocol: str, operation: str) -> Callable[[float], None]:
    """The ``observe(seconds)`` of one (protocol, operation) latency histogram; the caller keeps it, so the hot
    path pays no label lookup. A no-op while counting is off."""
    if not _enabled:
        return _nothing
    return _requests.labels(protocol, operation).observe


def fsynced(elapsed_ns: int, appends: int, nbytes: int) -> None:
    """A group-commit fsync round ended: its time, the appends it acknowledged, the bytes it made durable."""
    if _enabled:
        _fsync.observe(elapsed_ns / 1e9)
        if appends:
            _group_commit.observe(appends)
        _fsynced_bytes.inc(nbytes)


def isr_changed(before: int, after: int) -> None:
    """A partition this broker leads had its ISR changed from ``before`` to ``after`` members."""
    if _enabled:
        if after < before:
            _isr_shrinks.inc()
        elif after > before:
            _isr_expands.inc()


def leader_elected(cause: str, count: int = 1) -> None:
    if _enabled and count:
        _elections.labels(cause).inc(count)


def metadata_changed() -> None:
    if _enabled:
        _metadata_changes.inc()


def etcd_txn(seconds: float) -> None:
    if _enabled:
        _etcd_txn.observe(seconds)


def catch_up_copied(nbytes: int) -> None:
    """A follower copied one sealed segment file of ``nbytes`` from its leader."""
    if _enabled:
        _catch_up_copies.inc()
        _catch_up_bytes.inc(nbytes)


def write_committed(seconds: float) -> None:
    """An acks-ALL write was committed ``seconds`` after it reached the leader."""
    if _enabled:
        _apply.observe(seconds)


def follower_replicated(seconds: float) -> None:
    """A follower acknowledged the leader's newest write ``seconds`` after it reached the leader."""
    if _enabled:
        _replicate.observe(seconds)
