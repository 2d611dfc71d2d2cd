"""Metadata records: the etcd key layout and the stored encoding, which brokers of different versions share."""

from __future__ import annotations

import msgspec
import pytest

from tidelog.metadata.records import (
    STREAM_NAME_RE,
    BrokerRecord,
    Keys,
    PartitionRecord,
    StreamConfig,
    StreamRecord,
    decode_broker,
    decode_partition,
    decode_stream,
    encode,
)


def test_key_layout() -> None:
    keys = Keys()
    assert keys.broker("b1") == b"/tidelog/brokers/b1"
    assert keys.stream("orders") == b"/tidelog/streams/orders"
    assert keys.partition("orders", 7) == b"/tidelog/partitions/orders/00000007"
    assert keys.partitions_of("orders") == b"/tidelog/partitions/orders/"
    assert keys.partition("orders", 7).startswith(keys.partitions_of("orders"))


def test_a_custom_prefix_is_normalised() -> None:
    keys = Keys("/cluster-a/")
    assert keys.prefix == "/cluster-a"
    assert keys.stream("s") == b"/cluster-a/streams/s"


def test_partition_keys_sort_in_partition_order() -> None:
    keys = Keys()
    ids = [0, 1, 2, 9, 10, 11, 100, 9999]
    assert sorted(keys.partition("s", i) for i in ids) == [keys.partition("s", i) for i in ids]


def test_one_streams_partition_prefix_does_not_cover_another_stream() -> None:
    keys = Keys()
    assert not keys.partition("ab", 0).startswith(keys.partitions_of("a"))


def test_records_round_trip() -> None:
    config = StreamConfig(retention_max_age_ms=60_000, compact_enabled=True, flush_policy="never")
    stream = StreamRecord("orders", "orders.*", "workers", 3, 1, 1_700_000_000_000_000_000, config)
    partition = PartitionRecord("orders", 2, ("b1", "b2"), "b2", ("b2",), leader_epoch=4, paused=True, paused_ns=5)
    broker = BrokerRecord("b1", "10.0.0.1", 9292, 9293, 123)
    assert decode_stream(encode(stream)) == stream
    assert decode_partition(encode(partition)) == partition
    assert decode_broker(encode(broker)) == broker


def test_unset_overrides_are_not_stored() -> None:
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(StreamConfig())) == {}
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(StreamConfig(min_isr=2))) == {"min_isr": 2}


def test_a_record_written_without_newer_fields_still_decodes() -> None:
    old = msgspec.msgpack.encode({"stream": "s", "id": 0, "replicas": ["b1"], "leader": "b1", "isr": ["b1"]})
    record = decode_partition(old)
    assert (record.leader_epoch, record.paused, record.readonly) == (0, False, False)


def test_partition_subjects_follow_liftbridge() -> None:
    stream = StreamRecord("s", "events", "", 3, 1, 0)
    assert [stream.partition_subject(i) for i in range(3)] == ["events", "events.1", "events.2"]


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("a", True),
        ("A-b_c.9", True),
        ("x" * 249, True),
        ("x" * 250, False),
        ("", False),
        ("a/b", False),
        ("a b", False),
        ("a*", False),
    ],
)
def test_stream_name_pattern(name: str, valid: bool) -> None:
    assert bool(STREAM_NAME_RE.match(name)) is valid
