"""Prometheus collectors that read a broker's state at scrape time: nothing is counted on the write path.

Every partition already knows its log start and end, its high watermark, its ISR and how far each follower has
copied; the NATS ingests count what they stored and dropped; the mirror holds the brokers and partitions, the
cursor caches the consumer groups' committed offsets. :class:`BrokerCollector` turns that into metric families
when Prometheus asks, so a produce pays nothing for the metrics about it, and a scrape costs one pass over the
partitions this broker holds (a thousand of them answer in tens of milliseconds).

Families (labels in braces; ``metrics_partition_level = false`` drops the per-partition ones):

per partition, on every replica ``{stream, partition, role}`` (role: leader or follower)
    ``tidelog_partition_log_start_offset``, ``tidelog_partition_log_end_offset``,
    ``tidelog_partition_high_watermark``, ``tidelog_partition_bytes_out_total`` and
    ``tidelog_partition_records_out_total`` (what consumers fetched from this replica over the wire protocol; records
    are counted for replies sent from the segment file, i.e. plain TCP, not TLS)
per partition, on its leader ``{stream, partition}``
    ``tidelog_partition_leader`` (1 here; the other replicas export 0), ``tidelog_partition_replicas``,
    ``tidelog_partition_isr_size``, ``tidelog_partition_min_isr``, ``tidelog_partition_under_replicated``,
    ``tidelog_partition_at_min_isr``, ``tidelog_partition_under_min_isr``, ``tidelog_partition_records_in_total``,
    ``tidelog_partition_bytes_in_total`` (both since this broker became leader)
per follower, on the leader ``{stream, partition, follower}`` (Rama's replication telemetry)
    ``tidelog_follower_lag_records`` (leader's log end − the follower's), ``tidelog_follower_lag_seconds`` (how
    long since the follower last had everything the leader had; 0 when caught up)
per broker
    ``tidelog_broker_partitions_led``, ``tidelog_broker_replicas``, ``tidelog_broker_under_replicated_partitions``,
    ``tidelog_broker_at_min_isr_partitions``, ``tidelog_broker_under_min_isr_partitions``,
    ``tidelog_controller_active``, ``tidelog_metadata_revision``, ``tidelog_cluster_brokers_alive``,
    ``tidelog_offline_partitions`` (the active controller only: partitions whose leader is gone or none),
    ``tidelog_nats_messages_ingested_total``, ``tidelog_nats_messages_dropped_total{reason}``,
    ``tidelog_nats_acks_published_total``, ``tidelog_nats_ack_failures_total`` (summed over the ingests running
    now: they restart from 0 when leadership moves, which ``rate()`` reads as a counter reset)
tiered storage (a broker with ``tiered_store`` set)
    ``tidelog_tiered_uploads_total``, ``tidelog_tiered_upload_bytes_total`` (segments this broker uploaded, adopted
    ones included), ``tidelog_tiered_upload_failures_total`` (partition passes that failed and backed off),
    ``tidelog_tiered_remote_reads_total`` (ranged GETs to the store, read-ahead included),
    ``tidelog_tiered_remote_read_bytes_total`` (batch bytes served from the store); per partition led here
    ``{stream, partition}``: ``tidelog_partition_remote_start_offset`` and ``tidelog_partition_remote_end_offset``
    (the range in the store; absent while it holds nothing), ``tidelog_partition_upload_lag_records`` (offsets
    of sealed segments below the high watermark not uploaded yet) and ``tidelog_partition_upload_lag_seconds``
    (the age of the newest record of the oldest such segment; 0 when none waits)
consumer groups
    ``tidelog_consumer_group_members{group}`` (the group's coordinator exports it),
    ``tidelog_consumer_committed_offset{group, stream, partition}`` (the leader of the ``__cursors`` partition
    holding it), ``tidelog_consumer_lag_records{group, stream, partition}`` (where this broker also holds the
    partition: its high watermark − the offset after the committed one; elsewhere join
    ``tidelog_partition_high_watermark{role="leader"}`` on stream and partition in PromQL)

The pushed instruments (request and fsync latency, ISR changes, elections, etcd transactions) are in
:mod:`tidelog.telemetry`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tidelog.broker.partitions.partition import Partition
from tidelog.broker.tiering import Tiering
from tidelog.ui.view import BrokerView

__all__ = ["BrokerCollector"]

_P = ("stream", "partition")
_ROLE = ("stream", "partition", "role")
_FOLLOWER = ("stream", "partition", "follower")
_GROUP = ("group", "stream", "partition")


def _gauge(name: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _counter(name: str, doc: str, labels: Iterable[str] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=list(labels))


class BrokerCollector(Collector):
    """Reads one broker's state into metric families on every scrape (see the module docstring)."""

    def __init__(self, view: BrokerView) -> None:
        self._view = view

    def describe(self) -> list[Metric]:
        return []  # not known before a scrape: the registry must not call collect() to find out

    def collect(self) -> Iterator[Metric]:
        view = self._view
        per_partition = view.config.metrics_partition_level
        yield from self._partitions(per_partition)
        yield from self._broker()
        yield from self._nats()
        if view.tiering is not None:
            yield from self._tiering(view.tiering, per_partition)
        yield from self._groups(per_partition)

    # -- partitions --

    def _partitions(self, per_partition: bool) -> Iterator[Metric]:
        manager = self._view.manager
        led = manager.partitions()
        replicas = manager.replicas()
        start = _gauge("tidelog_partition_log_start_offset", "First offset in the replica's log.", _ROLE)
        end = _gauge("tidelog_partition_log_end_offset", "Offset the replica's next record gets.", _ROLE)
        hw = _gauge("tidelog_partition_high_watermark", "Offset after the last committed record.", _ROLE)
        out = _counter("tidelog_partition_bytes_out", "Record bytes fetched by consumers from this replica.", _ROLE)
        records_out = _counter("tidelog_partition_records_out", "Records fetched by consumers (plain TCP).", _ROLE)
        leader = _gauge("tidelog_partition_leader", "1 on the partition's leader, 0 on its followers.", _P)
        size = _gauge("tidelog_partition_replicas", "Replicas of the partition.", _P)
        isr = _gauge("tidelog_partition_isr_size", "Replicas in the ISR.", _P)
        min_isr = _gauge("tidelog_partition_min_isr", "Fewest ISR members that acks-ALL writes need.", _P)
        under = _gauge("tidelog_partition_under_replicated", "1 when the ISR lacks some replica.", _P)
        at_min = _gauge("tidelog_partition_at_min_isr", "1 when the ISR has exactly min_isr members.", _P)
        below = _gauge("tidelog_partition_under_min_isr", "1 when acks-ALL writes are refused (ISR < min_isr).", _P)
        records_in = _counter("tidelog_partition_records_in", "Records written since this leadership began.", _P)
        bytes_in = _counter("tidelog_partition_bytes_in", "Record bytes written since this leadership began.", _P)
        lag_records = _gauge("tidelog_follower_lag_records", "Leader's log end minus the follower's.", _FOLLOWER)
        lag_seconds = _gauge(
            "tidelog_follower_lag_seconds", "Seconds since the follower last had all the leader had.", _FOLLOWER
        )
        counts = [0, 0, 0]  # under-replicated, at min ISR, under min ISR
        if per_partition:
            for replica in replicas:
                labels = [replica.stream.name, str(replica.record.id)]
                role = "leader" if isinstance(replica, Partition) else "follower"
                start.add_metric([*labels, role], replica.log_start)
                end.add_metric([*labels, role], replica.log_end)
                hw.add_metric([*labels, role], replica.high_watermark)
                out.add_metric([*labels, role], replica.bytes_out)
                records_out.add_metric([*labels, role], replica.records_out)
                if role == "follower":
                    leader.add_metric(labels, 0)
        for partition in led:
            record = partition.record
            members = len(record.isr) or 1
            flags = (members < len(record.replicas), members == partition.min_isr, members < partition.min_isr)
            for i, flag in enumerate(flags):
                counts[i] += flag
            if not per_partition:
                continue
            labels = [partition.stream.name, str(record.id)]
            leader.add_metric(labels, 1)
            size.add_metric(labels, len(record.replicas))
            isr.add_metric(labels, members)
            min_isr.add_metric(labels, partition.min_isr)
            under.add_metric(labels, flags[0])
            at_min.add_metric(labels, flags[1])
            below.add_metric(labels, flags[2])
            records_in.add_metric(labels, partition.records_in)
            bytes_in.add_metric(labels, partition.bytes_in)
            log_end = partition.log_end
            monotonic = partition.clock.monotonic_ns()
            for follower in record.replicas:
                state = partition.followers.state(follower)
                if state is None:
                    continue
                behind = log_end - state.log_end if state.log_end >= 0 else log_end
                lag_records.add_metric([*labels, follower], max(0, behind))
                seconds = 0.0 if behind <= 0 else max(0, monotonic - state.caught_up_ns) / 1e9
                lag_seconds.add_metric([*labels, follower], seconds)
        if per_partition:
            yield from (start, end, hw, out, records_out, leader, size, isr, min_isr, under, at_min, below)
            yield from (records_in, bytes_in, lag_records, lag_seconds)
        broker = _gauge("tidelog_broker_partitions_led", "Partitions this broker leads.")
        broker.add_metric([], len(led))
        held = _gauge("tidelog_broker_replicas", "Partitions this broker holds a replica of (led or followed).")
        held.add_metric([], len(replicas))
        yield broker
        yield held
        for name, doc, value in (
            ("under_replicated_partitions", "Partitions led here whose ISR lacks some replica.", counts[0]),
            ("at_min_isr_partitions", "Partitions led here whose ISR has exactly min_isr members.", counts[1]),
            ("under_min_isr_partitions", "Partitions led here refusing acks-ALL writes (ISR < min_isr).", counts[2]),
        ):
            family = _gauge(f"tidelog_broker_{name}", doc)
            family.add_metric([], value)
            yield family

    # -- the broker and the controller --

    def _broker(self) -> Iterator[Metric]:
        view = self._view
        snapshot = view.mirror.snapshot
        controller = view.election.is_controller
        active = _gauge("tidelog_controller_active", "1 while this broker is the controller.")
        active.add_metric([], int(controller))
        revision = _gauge("tidelog_metadata_revision", "etcd revision of the broker's metadata mirror.")
        revision.add_metric([], snapshot.revision)
        alive = _gauge("tidelog_cluster_brokers_alive", "Brokers registered in etcd (their leases live).")
        alive.add_metric([], len(snapshot.brokers))
        yield from (active, revision, alive)
        if controller:
            offline = _gauge("tidelog_offline_partitions", "Partitions with no live leader (from the controller).")
            live = snapshot.brokers
            offline.add_metric([], sum(1 for p in snapshot.partitions.values() if p.leader not in live))
            yield offline

    def _nats(self) -> Iterator[Metric]:
        totals = self._view.manager.ingest_totals()
        ingested = _counter("tidelog_nats_messages_ingested", "NATS messages stored by this broker's ingests.")
        ingested.add_metric([], totals["appended"])
        dropped = _counter(
            "tidelog_nats_messages_dropped", "NATS messages received and not stored, by reason.", ["reason"]
        )
        dropped.add_metric(["duplicate"], totals["duplicates"])
        dropped.add_metric(["refused"], totals["refused"])
        dropped.add_metric(["failed"], totals["failed"])
        acks = _counter("tidelog_nats_acks_published", "Acks published to Liftbridge ack inboxes.")
        acks.add_metric([], totals["acks_published"])
        ack_failures = _counter("tidelog_nats_ack_failures", "Acks that could not be published.")
        ack_failures.add_metric([], totals["ack_failures"])
        yield from (ingested, dropped, acks, ack_failures)

    # -- tiered storage --

    def _tiering(self, tiering: Tiering, per_partition: bool) -> Iterator[Metric]:
        reader = tiering.reader
        for name, doc, amount in (
            ("uploads", "Segments uploaded to the tiered store (adopted ones included).", tiering.uploaded),
            ("upload_bytes", "Bytes of the segments uploaded to the tiered store.", tiering.uploaded_bytes),
            ("upload_failures", "Tiering passes over a partition that failed and backed off.", tiering.failures),
            ("remote_reads", "Ranged GETs made to the tiered store (read-ahead included).", reader.remote_reads),
            ("remote_read_bytes", "Batch bytes served to readers from the tiered store.", reader.read_bytes),
        ):
            family = _counter(f"tidelog_tiered_{name}", doc)
            family.add_metric([], amount)
            yield family
        if not per_partition:
            return
        start = _gauge("tidelog_partition_remote_start_offset", "First offset in the tiered store.", _P)
        end = _gauge("tidelog_partition_remote_end_offset", "Offset after the last one in the tiered store.", _P)
        lag = _gauge("tidelog_partition_upload_lag_records", "Committed offsets in sealed segments not uploaded.", _P)
        age = _gauge(
            "tidelog_partition_upload_lag_seconds", "Age of the newest record of the oldest segment not uploaded.", _P
        )
        for partition in self._view.manager.partitions():
            if tiering.policy(partition.stream) is None or partition.log.closed:
                continue
            labels = [partition.stream.name, str(partition.record.id)]
            remote = partition.remote_range
            if remote is not None:
                start.add_metric(labels, remote[0])
                end.add_metric(labels, remote[1])
            records, seconds = tiering.upload_backlog(partition)
            lag.add_metric(labels, records)
            age.add_metric(labels, seconds)
        yield from (start, end, lag, age)

    # -- consumer groups --

    def _groups(self, per_partition: bool) -> Iterator[Metric]:
        view = self._view
        if view.groups is not None:
            members = _gauge(
                "tidelog_consumer_group_members", "Members of each group this broker coordinates.", ["group"]
            )
            for group in view.groups.groups.values():
                if group.coordinator == view.broker_id:
                    members.add_metric([group.id], len(group.members))
            yield members
        if view.cursors is None or not per_partition:
            return
        committed = _gauge("tidelog_consumer_committed_offset", "A group's committed offset (its cursor).", _GROUP)
        lag = _gauge("tidelog_consumer_lag_records", "High watermark minus the committed offset.", _GROUP)
        manager = view.manager
        for group_id, stream, partition, offset in view.cursors.cached():
            labels = [group_id, stream, str(partition)]
            committed.add_metric(labels, offset)
            replica = manager.local(stream, partition) or manager.follower(stream, partition)
            if replica is not None:
                next_offset = max(offset + 1, replica.log_start)  # a cursor is the last offset consumed
                lag.add_metric(labels, max(0, replica.high_watermark - next_offset))
        yield committed
        yield lag
