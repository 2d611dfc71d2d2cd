"""A stream of a thousand partitions through a real broker: more partitions than etcd takes in one transaction
(128 operations by default), created in several and led, every one, by the broker; deleted the same way."""

from __future__ import annotations

import pytest

from tests.helpers import LONG_BOUND
from tidelog.protocol._gen import api_pb2
from tidelog.server import Broker

from .helpers import Stub, bounded, publish

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

PARTITIONS = 1000


async def test_a_stream_of_a_thousand_partitions_is_created_led_and_deleted(broker: Broker, stub: Stub) -> None:
    # A thousand partitions take several etcd transactions and a thousand opened logs each way: on a loaded
    # two-core machine that is more than the usual bound.
    await bounded(
        stub.CreateStream(api_pb2.CreateStreamRequest(name="wide", subject="wide", partitions=PARTITIONS)), LONG_BOUND
    )
    metadata = await bounded(stub.FetchMetadata(api_pb2.FetchMetadataRequest(streams=["wide"])))
    (stream,) = metadata.streamMetadata
    assert sorted(stream.partitions) == list(range(PARTITIONS))
    assert {p.leader for p in stream.partitions.values()} == {broker.id}
    assert (await publish(stub, "wide", b"last", partition=PARTITIONS - 1)).ack.offset == 0

    await bounded(stub.DeleteStream(api_pb2.DeleteStreamRequest(name="wide")), LONG_BOUND)
    metadata = await bounded(stub.FetchMetadata(api_pb2.FetchMetadataRequest()))
    assert "wide" not in [s.name for s in metadata.streamMetadata]
