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

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = [
    "REGISTRY",
    "catch_up_copied",
    "enabled",
    "etcd_txn",
    "follower_replicated",
    "fsynced",
    "isr_changed",
    "leader_elected",
    "metadata_changed",
    "request_observer",
    "set_enabled",
    "write_committed",
]

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

_enabled = True


class _Histogram:
    """Counts per bucket and a sum, with no lock: every hook runs on the broker's event loop thread (the flusher's
    worker threads report back through the loop), so ``observe`` is a bisect and two additions — about a tenth of
    ``prometheus_client.Histogram.observe``, which takes a lock per bucket it touches."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = tuple(bounds)
        self.counts = [0] * (len(self._bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self._bounds, value)] += 1  # le semantics: a value equal to a bound counts there
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        cumulative, out = 0, []
        for bound, count in zip((*map(floatToGoString, self._bounds), "+Inf"), self.counts, strict=True):
            cumulative += count
            out.append((bound, float(cumulative)))
        return out


class _Family:
    """One metric's instruments by label values (histograms or plain counters), exported at scrape time."""

    def __init__(self, name: str, doc: str, labels: Sequence[str] = (), buckets: Sequence[float] | None = None):
        self.name, self.doc, self.labels, self._buckets = name, doc, list(labels), buckets
        self.histograms: dict[tuple[str, ...], _Histogram] = {}
        self.counts: dict[tuple[str, ...], float] = {}
        _FAMILIES.append(self)

    def histogram(self, *values: str) -> _Histogram:
        found = self.histograms.get(values)
        if found is None:
            assert self._buckets is not None
            found = self.histograms[values] = _Histogram(self._buckets)
        return found

    def inc(self, amount: float = 1, *values: str) -> None:
        self.counts[values] = self.counts.get(values, 0) + amount

    def collect(self) -> Metric:
        if self._buckets is not None:
            family: Metric = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
            for values, h in list(self.histograms.items()):
                family.add_metric(list(values), h.buckets(), h.sum)  # type: ignore[attr-defined]
            return family
        counter = CounterMetricFamily(self.name, self.doc, labels=self.labels)
        for values, count in list(self.counts.items()):
            counter.add_metric(list(values), count)
        if not self.labels and not self.counts:
            counter.add_metric([], 0)
        return counter


_FAMILIES: list[_Family] = []


class _Collector(Collector):
    def collect(self) -> Iterator[Metric]:
        for family in _FAMILIES:
            yield family.collect()


REGISTRY = CollectorRegistry(auto_describe=False)
"""Every pushed instrument of this process (the per-broker state is collected at scrape time instead)."""
REGISTRY.register(_Collector())

_requests = _Family(
    "tidelog_request_duration_seconds",
    "Time from reading a request to its answer, per protocol (wire, grpc) and operation.",
    ("protocol", "operation"),
    _LATENCY_BUCKETS,
)
_fsync = _Family(
    "tidelog_fsync_duration_seconds", "Time of one group-commit fsync round (the dirty segments of one log).", (),
    _LATENCY_BUCKETS,
).histogram()  # fmt: skip
_group_commit = _Family(
    "tidelog_group_commit_appends",
    "Appends acknowledged by one fsync round (group commit: more than one under load).",
    (),
    _BATCH_BUCKETS,
).histogram()
_fsynced_bytes = _Family("tidelog_fsynced_bytes", "Bytes made durable by fsync rounds.")
_isr_shrinks = _Family("tidelog_isr_shrinks", "ISR changes of partitions led here that removed a replica.")
_isr_expands = _Family("tidelog_isr_expands", "ISR changes of partitions led here that added a replica.")
_elections = _Family(
    "tidelog_leader_elections",
    "Partition leaders chosen by this broker while controller, by cause (failover, balance, shutdown, ...).",
    ("cause",),
)
_metadata_changes = _Family(
    "tidelog_controller_metadata_changes", "Metadata transactions this broker committed in etcd while controller."
)
_etcd_txn = _Family(
    "tidelog_etcd_txn_duration_seconds", "Time of the controller's fenced etcd transactions.", (), _LATENCY_BUCKETS
).histogram()
_catch_up_copies = _Family(
    "tidelog_replica_catch_up_segments",
    "Sealed segment files this broker's followers copied from their leaders (far-horizon catch-up).",
)
_catch_up_bytes = _Family("tidelog_replica_catch_up_bytes", "Bytes of sealed segment files copied by catch-up.")
_apply = _Family(
    "tidelog_apply_latency_seconds",
    "Time from a write reaching the leader to its being committed (below the high watermark), acks ALL writes.",
    (),
    _LATENCY_BUCKETS,
).histogram()
_replicate = _Family(
    "tidelog_replicate_latency_seconds",
    "Time from a write reaching the leader to a follower acknowledging it (durable on the follower): Rama's "
    "replicate latency, measured when a follower's fetch covers the leader's newest write.",
    (),
    _LATENCY_BUCKETS,
).histogram()


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
    return _requests.histogram(protocol, operation).observe


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
        _elections.inc(count, cause)


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


_authz_denied = _Family(
    "tidelog_authz_denied",
    "Requests refused by authorization (PERMISSION_DENIED), per protocol (wire, grpc) and op or method.",
    ("protocol", "operation"),
)


def authz_denied(protocol: str, operation: str) -> None:
    """A request of ``operation`` was refused by the ACLs. Counted even with metrics off: denials are rare and
    an operator looks for them."""
    _authz_denied.inc(1, protocol, operation)
