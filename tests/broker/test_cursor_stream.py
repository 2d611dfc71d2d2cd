"""The controller creates ``__cursors`` once the cluster can hold it: with ``cursors_stream_replication_factor``
2 a lone broker waits (cursor requests answer UNAVAILABLE, saying why), and the stream appears with two replicas
as soon as a second broker joins."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from tests.broker.conftest import broker_config
from tests.broker.helpers import create_stream, expect_code
from tests.helpers import BOUND
from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.protocol.cursors import CURSORS_STREAM
from tidelog.server import Broker

pytestmark = pytest.mark.slow


async def test_cursors_wait_for_enough_brokers(tmp_path: Path) -> None:
    first = Broker(broker_config(tmp_path / "first", id="first", cursors_stream_replication_factor=2))
    await first.start()
    second: Broker | None = None
    try:
        assert first.grpc is not None and first.mirror is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{first.grpc.port}") as channel:
            stub = api_pb2_grpc.APIStub(channel)
            await create_stream(stub, "early")
            request = api_pb2.SetCursorRequest(stream="early", cursorId="c", offset=1)
            said = await expect_code(grpc.StatusCode.UNAVAILABLE, stub.SetCursor(request))
            assert "not created yet" in said
            assert first.mirror.snapshot.stream(CURSORS_STREAM) is None

            second = Broker(
                broker_config(
                    tmp_path / "second",
                    id="second",
                    nats_servers=tuple(first.nats_urls),
                    etcd_endpoints=tuple(first.etcd_endpoints),
                    cursors_stream_replication_factor=2,
                )
            )
            await second.start()
            snap = await first.mirror.wait_for(lambda s: bool(s.partitions_of(CURSORS_STREAM)), BOUND)
            (record,) = snap.partitions_of(CURSORS_STREAM)
            assert sorted(record.replicas) == ["first", "second"]
    finally:
        if second is not None:
            await second.stop()
        await first.stop()
