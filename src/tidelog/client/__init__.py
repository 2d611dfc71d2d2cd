"""The tidelog client: asyncio producer, consumer and admin over the wire protocol, with a sync facade.

Essential types (implementation modules are private to this package; import from here):

- :class:`Producer` — ``await producer.send(stream, value, key=...)`` returns a future of
  :class:`RecordMetadata`; batching (per partition, by size, count and linger) and pipelined sending happen
  behind it. Idempotent by default: batches carry a :class:`ProducerStamp` and sequences, so retries after a
  lost connection or a failover never store a record twice; ``producer_name`` fences older instances.
- :class:`Consumer` — ``async for record in consumer`` (:class:`ConsumerRecord`), or
  ``consumer.fetch_batches()`` (:class:`FetchedBatch`) to handle whole batches without decoding records;
  starts at ``"earliest"``, ``"latest"``, an offset or :class:`AtTimestamp`.
- :class:`GroupConsumer` — a member of a consumer group (Kafka's consumer): the group's members share its
  streams' partitions; ``async for record in consumer``; committed offsets (cursors named after the group,
  holding the next offset to read) with auto-commit, ``commit()``, ``seek``, ``position``, ``committed``,
  rebalance callbacks; partitions are :class:`StreamPartition`.
- :class:`Appender` — transactional appends: ``await appender.append(stream, partition, records,
  expected_offset=..., check_registers=..., union_registers=...)`` writes all the records or none, returning
  an :class:`AppendOutcome`; registers are :class:`LabelSet` / :class:`LabelSelector`, and a refusal's
  :func:`refusal_details` tell the log end and registers the broker saw.
- :class:`Admin` — create, delete, list and describe streams; cluster metadata.
- :class:`Cluster` — bootstrap, connections and cached metadata; pass one to several objects to share them.
- :class:`TidelogClient`, :class:`SyncProducer`, :class:`SyncConsumer`, :class:`SyncGroupConsumer`,
  :class:`SyncAdmin` — the same from
  plain threads (an event loop runs in a background thread).

Failures surface as :class:`~tidelog.protocol.errors.TidelogError` subclasses (``UnknownStreamError``,
``NotLeaderError``…); a lost connection is :class:`ConnectionClosedError`, a retriable ``UnavailableError``.
"""

from tidelog.client.accumulator import RecordMetadata
from tidelog.client.admin import Admin
from tidelog.client.appender import Appender, AppendOutcome, RefusalDetails, refusal_details
from tidelog.client.cluster import Cluster
from tidelog.client.consumer import AtTimestamp, Consumer, OffsetReset, StartPosition
from tidelog.client.group_consumer import GroupConsumer
from tidelog.client.group_membership import StreamPartition
from tidelog.client.idempotence import ProducerStamp
from tidelog.client.partitioner import DefaultPartitioner, KeyPartitioner, Partitioner, RoundRobinPartitioner
from tidelog.client.producer import Producer
from tidelog.client.records import FetchedBatch
from tidelog.client.sync import LoopThread, SyncAdmin, SyncConsumer, SyncGroupConsumer, SyncProducer, TidelogClient
from tidelog.protocol.connection import Connection, ConnectionClosedError, Response
from tidelog.protocol.errors import TidelogError
from tidelog.protocol.labels import LabelSelector, LabelSet
from tidelog.protocol.messages import Acks
from tidelog.protocol.records import Codec, NewRecord
from tidelog.protocol.records.rows import ConsumerRecord

__all__ = [
    "Acks",
    "Admin",
    "AppendOutcome",
    "Appender",
    "AtTimestamp",
    "Cluster",
    "Codec",
    "Connection",
    "ConnectionClosedError",
    "Consumer",
    "ConsumerRecord",
    "DefaultPartitioner",
    "FetchedBatch",
    "GroupConsumer",
    "KeyPartitioner",
    "LabelSelector",
    "LabelSet",
    "LoopThread",
    "NewRecord",
    "OffsetReset",
    "Partitioner",
    "Producer",
    "ProducerStamp",
    "RecordMetadata",
    "RefusalDetails",
    "Response",
    "RoundRobinPartitioner",
    "StartPosition",
    "StreamPartition",
    "SyncAdmin",
    "SyncConsumer",
    "SyncGroupConsumer",
    "SyncProducer",
    "TidelogClient",
    "TidelogError",
    "refusal_details",
]
