"""The sync facade, driven from a plain thread while the in-process broker keeps running on the test's loop.

Each scenario is an ordinary blocking function run through ``asyncio.to_thread``: that is exactly how a script
uses the facade (no event loop of its own), and the module's loop stays free to serve the broker meanwhile.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.helpers import BOUND
from tidelog.client import SyncAdmin, SyncConsumer, SyncProducer, TidelogClient
from tidelog.protocol.errors import UnknownStreamError

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


def one_client_for_admin_producer_and_consumer(address: str, stream_name: str) -> None:
    with TidelogClient(address) as client:
        client.admin.create_stream(stream_name, partitions=2)
        with client.producer(linger_ms=1) as producer:
            first = producer.send(stream_name, b"first", key=b"k").result(BOUND)
            rest = producer.send_many(stream_name, [b"a", b"b", b"c"], key=b"k", timeout=BOUND)
            assert [m.offset for m in rest] == [first.offset + 1, first.offset + 2, first.offset + 3]
            assert producer.send_and_wait(stream_name, b"last", key=b"k").offset == first.offset + 4
        with client.consumer(stream_name, partitions=[first.partition], stop_at_end=True) as consumer:
            assert [r.value for r in consumer] == [b"first", b"a", b"b", b"c", b"last"]
            assert consumer.position(first.partition) == 5
        info = client.admin.describe_stream(stream_name)
        assert sum(p.high_watermark for p in info.partitions) == 5
        client.admin.delete_stream(stream_name)
        with pytest.raises(UnknownStreamError):
            client.admin.describe_stream(stream_name)


def standalone_facades(address: str, stream_name: str) -> None:
    with SyncAdmin(address) as admin:
        admin.create_stream(stream_name)
        assert [s.name for s in admin.list_streams(stream_name)] == [stream_name]
    with SyncProducer(address) as producer:
        futures = [producer.send(stream_name, b"%d" % i) for i in range(20)]
        producer.flush(BOUND)
        assert [f.result(BOUND).offset for f in futures] == list(range(20))
    with SyncConsumer(address, stream_name, stop_at_end=True) as consumer:
        assert sum(batch.record_count for batch in consumer.fetch_batches()) == 20


async def test_one_client_for_admin_producer_and_consumer(address: str, stream_name: str) -> None:
    await asyncio.wait_for(asyncio.to_thread(one_client_for_admin_producer_and_consumer, address, stream_name), 60)


async def test_standalone_facades(address: str, stream_name: str) -> None:
    await asyncio.wait_for(asyncio.to_thread(standalone_facades, address, stream_name), 60)
