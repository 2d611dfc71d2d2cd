"""A broker whose etcd is a three-member cluster keeps serving when the member it talks to is SIGKILLed under
load: publishes keep being acknowledged and stored, and metadata changes (creating, pausing, deleting a stream)
keep working through the two members left."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from tests.broker.conftest import broker_config
from tests.broker.helpers import bounded, create_stream, read_until_stop
from tests.helpers import BOUND
from tidelog.protocol._gen import api_pb2 as pb
from tidelog.protocol._gen import api_pb2_grpc
from tidelog.server import Broker
from tidelog.testing.etcd_cluster import EtcdCluster

pytestmark = pytest.mark.slow

AFTER_KILL = 200  # publishes acknowledged after the kill before the test is satisfied
WITHIN = 60.0  # seconds for etcd to elect a leader and the client to move on, on a loaded 2-core machine


async def test_the_broker_keeps_serving_when_an_etcd_member_dies(tmp_path: Path) -> None:
    async with EtcdCluster(tmp_path / "etcd") as etcd:
        broker = Broker(broker_config(tmp_path / "b", id="b", etcd_endpoints=tuple(etcd.endpoints)))
        await broker.start()
        try:
            assert broker.grpc is not None and broker.mirror is not None
            async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.grpc.port}") as channel:
                stub = api_pb2_grpc.APIStub(channel)
                await create_stream(stub, "load")
                acked: list[int] = []
                loaded = asyncio.Event()  # under load: time to kill
                killed_at: list[int] = []  # how many were acknowledged when the member was killed

                async def produce() -> None:
                    while not killed_at or len(acked) < killed_at[0] + AFTER_KILL:
                        request = pb.PublishRequest(stream="load", value=str(len(acked)).encode(), ackPolicy=pb.ALL)
                        response = await asyncio.wait_for(stub.Publish(request), BOUND)
                        acked.append(response.ack.offset)
                        if len(acked) >= 50:
                            loaded.set()

                load = asyncio.ensure_future(produce())
                warm = asyncio.ensure_future(loaded.wait())
                await asyncio.wait({load, warm}, timeout=BOUND, return_when=asyncio.FIRST_COMPLETED)
                warm.cancel()
                assert not load.done(), load
                await etcd.kill(0)  # the first endpoint: the member the broker's client is connected to
                killed_at.append(len(acked))
                await asyncio.wait_for(load, WITHIN)  # every publish after the kill was acknowledged

                # metadata changes go through the members left (retried while etcd elects a new leader)
                deadline = asyncio.get_running_loop().time() + WITHIN
                while True:
                    try:
                        await create_stream(stub, "after-kill")
                        break
                    except grpc.aio.AioRpcError:
                        if asyncio.get_running_loop().time() > deadline:
                            raise
                        await asyncio.sleep(0.2)
                await bounded(stub.PauseStream(pb.PauseStreamRequest(name="after-kill")))
                await bounded(stub.DeleteStream(pb.DeleteStreamRequest(name="after-kill")))
                await broker.mirror.wait_for(lambda s: s.stream("after-kill") is None, BOUND)
                assert "b" in broker.mirror.snapshot.brokers, "the broker is still registered"

                stored = await read_until_stop(stub, "load")
                assert [m.offset for m in stored] == list(range(len(acked))) == sorted(acked)
        finally:
            await broker.stop()
