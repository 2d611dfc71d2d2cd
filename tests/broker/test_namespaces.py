"""Two clusters on one etcd and one NATS, told apart by their ``namespace``: neither sees the other's brokers,
streams, controller or activity, their internal streams listen on subjects of their own, and ``tidelog cluster
status --namespace`` reads one of them."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import grpc
import nats
import pytest

from tests.broker.conftest import broker_config
from tests.broker.helpers import bounded, create_stream, read_until_stop
from tests.helpers import BOUND
from tidelog.local.serve_process import TIDELOG, clean_env
from tidelog.metadata.activity import ACTIVITY_STREAM
from tidelog.protocol._gen import api_pb2 as pb
from tidelog.protocol._gen import api_pb2_grpc
from tidelog.protocol.cursors import CURSORS_STREAM
from tidelog.server import Broker

pytestmark = pytest.mark.slow

SHARED = 20


async def _streams(port: int) -> set[str]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        response = await bounded(api_pb2_grpc.APIStub(channel).FetchMetadata(pb.FetchMetadataRequest()))
    return {s.name for s in response.streamMetadata}


async def _activity(port: int) -> set[str]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        messages = await read_until_stop(api_pb2_grpc.APIStub(channel), ACTIVITY_STREAM)
    return {pb.ActivityStreamEvent.FromString(m.value).createStreamOp.stream for m in messages}


async def _status(*args: str) -> dict[str, object]:
    def run() -> subprocess.CompletedProcess[str]:
        argv = [str(TIDELOG), "cluster", "status", *args, "-o", "json"]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=clean_env())

    result = await asyncio.to_thread(run)
    assert result.returncode == 0, result.stderr
    found: dict[str, object] = json.loads(result.stdout)
    return found


async def test_two_namespaces_share_etcd_and_nats_without_seeing_each_other(tmp_path: Path) -> None:
    a = Broker(broker_config(tmp_path / "a", id="a", namespace="alpha"))
    await a.start()
    b: Broker | None = None
    try:
        b = Broker(
            broker_config(
                tmp_path / "b",
                id="b",
                namespace="beta",
                nats_servers=tuple(a.nats_urls),
                etcd_endpoints=tuple(a.etcd_endpoints),
            )
        )
        await b.start()
        assert a.grpc is not None and b.grpc is not None and a.mirror is not None and b.mirror is not None
        assert a.election is not None and b.election is not None
        assert a.election.controller_id == "a" and b.election.controller_id == "b", "each cluster its controller"
        for broker in (a, b):
            assert broker.mirror is not None
            await broker.mirror.wait_for(lambda s: s.stream(ACTIVITY_STREAM) is not None, BOUND)
            await broker.mirror.wait_for(lambda s: s.stream(CURSORS_STREAM) is not None, BOUND)
        assert set(a.mirror.snapshot.brokers) == {"a"} and set(b.mirror.snapshot.brokers) == {"b"}

        subjects = {
            (broker.config.namespace, name): broker.mirror.snapshot.stream(name).subject  # type: ignore[union-attr]
            for broker in (a, b)
            if broker.mirror is not None
            for name in (CURSORS_STREAM, ACTIVITY_STREAM)
        }
        assert subjects == {
            ("alpha", CURSORS_STREAM): "_alpha.cursors",
            ("alpha", ACTIVITY_STREAM): "_alpha.activity",
            ("beta", CURSORS_STREAM): "_beta.cursors",
            ("beta", ACTIVITY_STREAM): "_beta.activity",
        }

        async with grpc.aio.insecure_channel(f"127.0.0.1:{a.grpc.port}") as channel:
            await create_stream(api_pb2_grpc.APIStub(channel), "only-a", "ns.only-a")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{b.grpc.port}") as channel:
            # the same name in the other cluster is another stream, created without conflict
            await create_stream(api_pb2_grpc.APIStub(channel), "only-b", "ns.only-b")
            await create_stream(api_pb2_grpc.APIStub(channel), "only-a", "ns.other")
        assert "only-b" not in await _streams(a.grpc.port)
        assert {"only-a", "only-b"} <= await _streams(b.grpc.port)
        assert a.mirror.snapshot.stream("only-a").subject == "ns.only-a"  # type: ignore[union-attr]

        async def seen_by(broker: Broker, name: str) -> bool:
            assert broker.grpc is not None
            return name in await _activity(broker.grpc.port)

        for _ in range(200):  # the controllers publish after the changes commit: bounded polling
            if await seen_by(a, "only-a") and await seen_by(b, "only-b"):
                break
            await asyncio.sleep(0.05)
        assert "only-b" not in await _activity(a.grpc.port)
        assert {"only-a", "only-b"} <= await _activity(b.grpc.port)

        # streams of one group on one subject share its messages inside a cluster, never across clusters
        async with grpc.aio.insecure_channel(f"127.0.0.1:{a.grpc.port}") as channel:
            await create_stream(api_pb2_grpc.APIStub(channel), "grouped-a", "ns.shared", group="G")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{b.grpc.port}") as channel:
            await create_stream(api_pb2_grpc.APIStub(channel), "grouped-b", "ns.shared", group="G")
        nc = await nats.connect(a.nats_urls, connect_timeout=BOUND, allow_reconnect=False)
        try:
            for n in range(SHARED):
                await nc.publish("ns.shared", str(n).encode())
            await nc.flush()
        finally:
            await nc.close()
        for broker, name in ((a, "grouped-a"), (b, "grouped-b")):
            assert broker.grpc is not None
            async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.grpc.port}") as channel:
                stub = api_pb2_grpc.APIStub(channel)
                for _ in range(200):  # stored asynchronously: bounded polling
                    stored = await read_until_stop(stub, name)
                    if len(stored) >= SHARED:
                        break
                    await asyncio.sleep(0.05)
            assert [m.value for m in stored] == [str(n).encode() for n in range(SHARED)], name

        etcd = a.etcd_endpoints[0]
        alpha = await _status("-e", etcd, "--namespace", "alpha")
        beta = await _status("-e", etcd, "--namespace", "beta")
        assert [broker["id"] for broker in alpha["brokers"]] == ["a"]  # type: ignore[index, union-attr]
        assert [broker["id"] for broker in beta["brokers"]] == ["b"]  # type: ignore[index, union-attr]
        alpha_streams = {p["stream"] for p in alpha["partitions"]}  # type: ignore[index, union-attr]
        assert "only-a" in alpha_streams and "only-b" not in alpha_streams
        # without flags, the broker running on --data-dir says where its etcd is and which namespace it has
        local = await _status("--data-dir", str(b.config.data_dir))
        assert [broker["id"] for broker in local["brokers"]] == ["b"]  # type: ignore[index, union-attr]
    finally:
        if b is not None:
            await b.stop()
        await a.stop()
