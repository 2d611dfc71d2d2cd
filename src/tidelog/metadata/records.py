"""Typed metadata records as stored in etcd, and the keys they live under.

Every value in the keyspace is one msgspec-msgpack encoded record. Records are frozen: a change is a new record
written by a guarded etcd transaction, and the broker's mirror swaps whole records, so readers never see a
half-updated partition. Key layout under the cluster prefix ``/{namespace}`` (default ``/tidelog``; see
:mod:`~tidelog.metadata.namespace`)::

    {prefix}/brokers/{broker_id}                 BrokerRecord      (attached to the broker's lease)
    {prefix}/streams/{stream}                    StreamRecord
    {prefix}/partitions/{stream}/{partition:08d} PartitionRecord
    {prefix}/controller                          ControllerRecord  (attached to the controller's lease)
    {prefix}/controller-epoch                    the controller epoch, a msgpack integer
    {prefix}/producer-ids                        the next idempotent-producer id to hand out, a msgpack integer
    {prefix}/producers/{name}                    ProducerRecord    (a named producer's id and latest epoch)
    {prefix}/creating/{stream}                   CreationRecord    (a stream being created in several transactions)
    {prefix}/activity-published                  the newest revision published to __activity, a msgpack integer

Partitions whose stream record does not exist are invisible: the mirror holds them back until the stream record
arrives, so a stream whose partitions are written in several transactions appears whole, at once (see
:mod:`tidelog.metadata.stream_creation`).

Durations are milliseconds and timestamps nanoseconds since the Unix epoch, as in Liftbridge's API.
"""

from __future__ import annotations

import re
from typing import Final

import msgspec

STREAM_NAME_RE: Final = re.compile(r"^[A-Za-z0-9_\-.]{1,249}$")
"""Stream names become directory names and etcd key segments: no slashes, no wildcards, no spaces."""


class StreamConfig(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=False):
    """Per-stream overrides of the broker defaults. ``None`` means "use the broker default"."""

    retention_max_bytes: int | None = None
    retention_max_messages: int | None = None
    retention_max_age_ms: int | None = None
    cleaner_interval_ms: int | None = None
    segment_max_bytes: int | None = None
    segment_max_age_ms: int | None = None
    compact_enabled: bool | None = None
    compact_max_goroutines: int | None = None
    auto_pause_time_ms: int | None = None
    auto_pause_disable_if_subscribers: bool | None = None
    min_isr: int | None = None
    optimistic_concurrency_control: bool | None = None
    encryption: bool | None = None
    flush_policy: str | None = None
    flush_interval_ms: int | None = None
    compact_min_lag_ms: int | None = None
    """Compaction never removes a record younger than this (Kafka's ``min.compaction.lag.ms``)."""
    unclean_leader_election: bool | None = None
    """Whether the controller may elect a replica outside the ISR when no ISR member is alive (loses committed
    records; Kafka's ``unclean.leader.election.enable``). ``None``: the broker default."""
    tiered: bool | None = None
    """Whether the stream's sealed segments go to the broker's tiered store; ``None``: yes when the broker has one
    and the stream is not compacted (a compacted stream cannot tier)."""
    local_retention_ms: int | None = None
    """On a tiered stream, how long offloaded segments stay on brokers' disks; ``None``: the broker default."""
    local_retention_bytes: int | None = None
    """On a tiered stream, how many bytes of offloaded segments stay on brokers' disks; ``None``: the default."""


class StreamRecord(msgspec.Struct, frozen=True):
    """A stream: a name bound to a NATS subject, split into ``partitions`` partitions."""

    name: str
    subject: str
    group: str
    partitions: int
    replication_factor: int
    created_ns: int
    config: StreamConfig = StreamConfig()

    def partition_subject(self, partition: int) -> str:
        """The NATS subject partition ``partition`` listens on: the stream's subject for 0, ``subject.i`` after."""
        return self.subject if partition == 0 else f"{self.subject}.{partition}"


class PartitionRecord(msgspec.Struct, frozen=True):
    """One partition's placement and state.

    ``leader_epoch`` grows by one on every leader change; followers truncate by it. ``paused`` partitions are
    resumed by the next write to them (and, when paused with ``resume_all``, so are their paused siblings);
    ``readonly`` ones refuse writes.

    ``suspended`` (fail to safety, seed 002): why a leader refused appends, the evidence it found that the
    partition lost committed data; empty while it takes appends. Every leader of the partition refuses appends
    while it is set, whichever broker leads. Only ``tidelog partition reset-head`` clears it, and that bumps
    the leader epoch and records the head the operator confirmed: ``head_offset`` for the leadership of
    ``head_epoch`` (-1: never confirmed). See :mod:`tidelog.broker.partitions.safety`.
    """

    stream: str
    id: int
    replicas: tuple[str, ...]
    leader: str
    isr: tuple[str, ...]
    leader_epoch: int = 0
    paused: bool = False
    paused_ns: int = 0
    resume_all: bool = False
    resumed_ns: int = 0
    readonly: bool = False
    readonly_ns: int = 0
    suspended: str = ""
    suspended_ns: int = 0
    head_epoch: int = -1
    head_offset: int = -1
    data_keys: tuple[bytes, ...] = ()
    """An encrypted stream's data keys for this partition, wrapped by the brokers' master key; the key id of
    each is its index, and the last one seals new batches (:mod:`tidelog.broker.encryption`). Empty: plain."""
    reassign_to: tuple[str, ...] = ()
    """A reassignment in progress (:mod:`tidelog.metadata.reassignment_plans`): the replicas wanted, preferred
    leader first; empty: none. While it runs, ``replicas`` is ``reassign_from`` and the brokers being added."""
    reassign_from: tuple[str, ...] = ()
    """The replicas before the reassignment in progress: what cancelling it restores."""
    throttle_bps: int = 0
    """While reassigning: the bytes per second the leader sends each replica being added (0: no cap)."""


class BrokerRecord(msgspec.Struct, frozen=True):
    """A live broker: where clients reach it. Its key is bound to the broker's etcd lease."""

    id: str
    host: str
    port: int
    wire_port: int
    started_ns: int
    rack: str = ""
    """The broker's rack (its ``rack`` setting; empty: none): placement spreads replicas across racks."""


class Keys:
    """Builds and parses the etcd keys of one cluster prefix."""

    def __init__(self, prefix: str = "/tidelog") -> None:
        self.prefix = prefix.rstrip("/")
        self.brokers = f"{self.prefix}/brokers/"
        self.streams = f"{self.prefix}/streams/"
        self.partitions = f"{self.prefix}/partitions/"
        self.creations = f"{self.prefix}/creating/"

    def broker(self, broker_id: str) -> bytes:
        return f"{self.brokers}{broker_id}".encode()

    def stream(self, name: str) -> bytes:
        return f"{self.streams}{name}".encode()

    def partition(self, stream: str, partition: int) -> bytes:
        return f"{self.partitions}{stream}/{partition:08d}".encode()

    def partitions_of(self, stream: str) -> bytes:
        return f"{self.partitions}{stream}/".encode()

    def creation(self, stream: str) -> bytes:
        """The marker of ``stream``'s creation while its partitions are being written (:class:`CreationRecord`)."""
        return f"{self.creations}{stream}".encode()

    def controller(self) -> bytes:
        """The key whose holder is the controller; it lives only as long as that broker's lease."""
        return f"{self.prefix}/controller".encode()

    def controller_epoch(self) -> bytes:
        """The last controller epoch handed out; it only grows, and outlives every controller."""
        return f"{self.prefix}/controller-epoch".encode()

    def producer_ids(self) -> bytes:
        """The next producer id to hand out; only grows (a guarded increment), so no id is issued twice."""
        return f"{self.prefix}/producer-ids".encode()

    def producer(self, name: str) -> bytes:
        """A named producer's id and epoch (:class:`ProducerRecord`)."""
        return f"{self.prefix}/producers/{name}".encode()


_encoder = msgspec.msgpack.Encoder()
_stream_decoder = msgspec.msgpack.Decoder(StreamRecord)
_partition_decoder = msgspec.msgpack.Decoder(PartitionRecord)
_broker_decoder = msgspec.msgpack.Decoder(BrokerRecord)


def encode(record: StreamRecord | PartitionRecord | BrokerRecord) -> bytes:
    return _encoder.encode(record)


def decode_stream(data: bytes) -> StreamRecord:
    return _stream_decoder.decode(data)


def decode_partition(data: bytes) -> PartitionRecord:
    return _partition_decoder.decode(data)


def decode_broker(data: bytes) -> BrokerRecord:
    return _broker_decoder.decode(data)


class ControllerRecord(msgspec.Struct, frozen=True):
    """The controller: which broker holds the controller key, and for which controller epoch.

    Every election writes a new epoch, so a (broker, epoch) pair names exactly one term: comparing the key's value
    with a term's record is enough to know that the term still holds.
    """

    broker_id: str
    epoch: int


_controller_decoder = msgspec.msgpack.Decoder(ControllerRecord)
_epoch_decoder = msgspec.msgpack.Decoder(int)


def encode_controller(record: ControllerRecord) -> bytes:
    return _encoder.encode(record)


def decode_controller(data: bytes) -> ControllerRecord:
    return _controller_decoder.decode(data)


def encode_controller_epoch(epoch: int) -> bytes:
    """msgpack encodes an integer in its shortest form only, so equal epochs give equal bytes: etcd may compare
    them byte for byte in a transaction guard."""
    return _encoder.encode(epoch)


def decode_controller_epoch(data: bytes) -> int:
    return _epoch_decoder.decode(data)


class ProducerRecord(msgspec.Struct, frozen=True, array_like=True):
    """A named idempotent producer: its id and the newest epoch handed out (msgpack ``[id, epoch]``)."""

    producer_id: int
    epoch: int


_producer_decoder = msgspec.msgpack.Decoder(ProducerRecord)


def encode_producer(record: ProducerRecord) -> bytes:
    return _encoder.encode(record)


def decode_producer(data: bytes) -> ProducerRecord:
    return _producer_decoder.decode(data)


def encode_counter(value: int) -> bytes:
    """A counter as msgpack (shortest form, so equal values are equal bytes, as for the controller epoch)."""
    return _encoder.encode(value)


def decode_counter(data: bytes) -> int:
    return _epoch_decoder.decode(data)


class CreationRecord(msgspec.Struct, frozen=True, array_like=True):
    """A stream creation in progress: who started it (a token of its own, and the controller epoch it was started
    in: a creation of an older epoch is abandoned, its controller can no longer write) and when."""

    token: str
    epoch: int
    started_ns: int


_creation_decoder = msgspec.msgpack.Decoder(CreationRecord)


def encode_creation(record: CreationRecord) -> bytes:
    return _encoder.encode(record)


def decode_creation(data: bytes) -> CreationRecord:
    return _creation_decoder.decode(data)
