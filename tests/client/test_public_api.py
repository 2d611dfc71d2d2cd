"""``tidelog.client`` exports a curated set of names; this guards it (httpx's habit)."""

from __future__ import annotations

import tidelog.client

EXPECTED = {
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
}


def test_all_is_exactly_the_curated_set() -> None:
    assert set(tidelog.client.__all__) == EXPECTED
    assert len(tidelog.client.__all__) == len(EXPECTED)  # no duplicates
    assert tidelog.client.__all__ == sorted(tidelog.client.__all__)


def test_every_exported_name_exists_and_nothing_else_public_leaks() -> None:
    for name in tidelog.client.__all__:
        assert getattr(tidelog.client, name) is not None
    public = {n for n in vars(tidelog.client) if not n.startswith("_")}
    modules = {
        "accumulator",
        "admin",
        "appender",
        "cluster",
        "connection",
        "consumer",
        "group_commits",
        "group_consumer",
        "group_membership",
        "idempotence",
        "partition_reader",
        "partitioner",
        "producer",
        "records",
        "sender",
        "sync",
    }
    assert public - modules == EXPECTED
