"""Tiered storage against a real S3-compatible server (``weed mini``, a child process on loopback ports).

Offload and reads from offset 0 through S3; wrong credentials refused at start in one line; the store going away
(nothing more is deleted locally, the broker keeps taking and serving records).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio

from tests.helpers import BOUND
from tidelog.launch.object_store import S3Server
from tidelog.launch.ports import free_port
from tidelog.local.serve_process import TIDELOG, clean_env
from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.server import Broker
from tidelog.storage.tiered_store import TieredStoreConfigError

from .conftest import broker_config
from .helpers import read_until_stop, until

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

COUNT = 300


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def s3(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3"))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture(scope="module")
def broker_settings(s3: S3Server) -> dict[str, Any]:
    return {
        **s3.settings(),
        "tiered_interval_ms": 100,
        "cleaner_interval_ms": 100,
        "segment_max_bytes": 16 * 1024,
        "max_message_bytes": 4096,
        "local_retention_bytes": 40 * 1024,
        "tiered_store_timeout_ms": 3000,
    }


def value(i: int) -> bytes:
    return f"{i:06d}".encode() * 80


async def publish(stub: api_pb2_grpc.APIStub, stream: str, first: int, count: int) -> None:
    for i in range(first, first + count):
        await stub.Publish(api_pb2.PublishRequest(stream=stream, value=value(i), ackPolicy=api_pb2.ALL))


async def test_offloaded_to_s3_and_read_back_from_zero(
    broker: Broker, stub: api_pb2_grpc.APIStub, stream_name: str
) -> None:
    await stub.CreateStream(api_pb2.CreateStreamRequest(subject=stream_name, name=stream_name))
    await publish(stub, stream_name, 0, COUNT)
    assert broker.manager is not None and broker.tiering is not None
    partition = broker.manager.leader_of(stream_name, 0)
    await until(lambda: partition.local_log_start > 0 and partition.log_start == 0, "offload to S3")
    messages = await read_until_stop(
        stub, stream_name, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST
    )
    assert [m.value for m in messages] == [value(i) for i in range(COUNT)]
    assert broker.tier_catalog is not None and broker.tier_catalog.reader.remote_reads > 0


async def test_wrong_credentials_are_refused_at_start(s3: S3Server, tmp_path: Path) -> None:
    settings = {**s3.settings(), "tiered_store_secret_access_key": "not-the-secret"}
    broker = Broker(broker_config(tmp_path, **settings))
    with pytest.raises(TieredStoreConfigError, match="refused the credentials"):
        await broker.start()
    await broker.stop()


async def test_a_store_that_does_not_answer_at_start_is_an_outage_not_a_refusal(
    s3: S3Server, tmp_path: Path, stream_name: str
) -> None:
    settings = {
        **s3.settings(),
        "tiered_store_endpoint": f"http://127.0.0.1:{free_port()}",
        "tiered_store_timeout_ms": 500,
    }
    broker = Broker(broker_config(tmp_path, **settings))
    try:
        await broker.start()  # serves; segments stay local until the store answers
        assert broker.grpc is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.grpc.port}") as channel:
            stub = api_pb2_grpc.APIStub(channel)
            await stub.CreateStream(api_pb2.CreateStreamRequest(subject=stream_name, name=stream_name))
            await publish(stub, stream_name, 0, 3)
            messages = await read_until_stop(
                stub, stream_name, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST
            )
            assert [m.value for m in messages] == [value(i) for i in range(3)]
    finally:
        await broker.stop()


async def test_an_unreachable_store_deletes_nothing_more_and_the_broker_keeps_serving(
    tmp_path: Path, stream_name: str
) -> None:
    server = S3Server(tmp_path / "s3")
    await server.start()
    settings = {
        **server.settings(),
        "tiered_interval_ms": 100,
        "cleaner_interval_ms": 100,
        "segment_max_bytes": 16 * 1024,
        "max_message_bytes": 4096,
        "local_retention_bytes": 1,  # everything offloaded may go from the disk at once
        "tiered_store_timeout_ms": 1000,
    }
    broker = Broker(broker_config(tmp_path / "broker", **settings))
    try:
        await broker.start()
        assert broker.grpc is not None and broker.manager is not None and broker.tier_catalog is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.grpc.port}") as channel:
            stub = api_pb2_grpc.APIStub(channel)
            await stub.CreateStream(api_pb2.CreateStreamRequest(subject=stream_name, name=stream_name))
            await publish(stub, stream_name, 0, 100)
            partition = broker.manager.leader_of(stream_name, 0)
            catalog = broker.tier_catalog
            await until(lambda: (catalog.remote_end(stream_name, 0) or 0) > 0, "a first offload")
            await server.stop()
            failures = broker.tiering.failures if broker.tiering is not None else 0
            await publish(stub, stream_name, 100, 200)
            assert broker.tiering is not None
            await until(lambda: broker.tiering is not None and broker.tiering.failures > failures, "a failed upload")
            assert broker.cleaner is not None
            await broker.cleaner.wait_for_passes(2)
            remote_end = catalog.remote_end(stream_name, 0)
            assert remote_end is not None
            assert partition.local_log_start <= remote_end  # nothing deleted locally that is not offloaded
            sealed_after = [s for s in partition.log.segments[:-1] if s.base_offset >= remote_end]
            assert sealed_after, "segments sealed while the store was away stay on disk"
            messages = await read_until_stop(
                stub,
                stream_name,
                startPosition=api_pb2.OFFSET,
                startOffset=remote_end,
                stopPosition=api_pb2.STOP_LATEST,
            )
            assert [m.value for m in messages] == [value(i) for i in range(remote_end, 300)]
    finally:
        await broker.stop()
        await server.stop()


async def test_a_stalled_store_backs_uploads_off_and_they_resume_when_it_answers_again(
    tmp_path: Path, stream_name: str
) -> None:
    server = S3Server(tmp_path / "s3")
    await server.start()
    settings = {
        **server.settings(),
        "tiered_interval_ms": 100,
        "segment_max_bytes": 16 * 1024,
        "max_message_bytes": 4096,
        "local_retention_bytes": 1,
        "tiered_store_timeout_ms": 1000,
    }
    broker = Broker(broker_config(tmp_path / "broker", **settings))
    stalled = False
    try:
        await broker.start()
        assert broker.grpc is not None and broker.manager is not None and broker.tier_catalog is not None
        assert broker.tiering is not None and server.process is not None
        tiering, catalog = broker.tiering, broker.tier_catalog
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.grpc.port}") as channel:
            stub = api_pb2_grpc.APIStub(channel)
            await stub.CreateStream(api_pb2.CreateStreamRequest(subject=stream_name, name=stream_name))
            await publish(stub, stream_name, 0, 100)
            partition = broker.manager.leader_of(stream_name, 0)
            await until(lambda: (catalog.remote_end(stream_name, 0) or 0) > 0, "a first offload")
            server.process.signal(signal.SIGSTOP)  # it takes connections and answers nothing: requests time out
            stalled = True
            failures = tiering.failures
            await publish(stub, stream_name, 100, 200)  # the broker keeps taking records meanwhile
            await until(lambda: tiering.failures > failures, "an upload that timed out")
            stalled_end = catalog.remote_end(stream_name, 0)
            assert stalled_end is not None and partition.local_log_start <= stalled_end
            server.process.signal(signal.SIGCONT)
            stalled = False
            sealed_end = partition.log.segments[-1].base_offset
            await until(lambda: (catalog.remote_end(stream_name, 0) or 0) >= sealed_end, "uploads resumed")
            await until(lambda: partition.local_log_start > stalled_end, "local retention resumed")
            messages = await read_until_stop(
                stub, stream_name, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST
            )
            assert [m.value for m in messages] == [value(i) for i in range(300)]
    finally:
        if stalled and server.process is not None:
            server.process.signal(signal.SIGCONT)
        await broker.stop()
        await server.stop()


async def test_serve_with_wrong_credentials_is_one_line_and_nonzero(s3: S3Server, tmp_path: Path) -> None:
    argv = [
        str(TIDELOG), "serve", "--data-dir", str(tmp_path), "--port", "0", "--wire-port", "0", "--http-port", "0",
        "--embedded-nats-port", "0", "--tiered-store", s3.url,
        "-s", f"tiered_store_endpoint={s3.endpoint}",
        "-s", f"tiered_store_access_key_id={s3.access_key_id}",
        "-s", "tiered_store_secret_access_key=wrong",
    ]  # fmt: skip

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=BOUND, env=clean_env())

    done = await asyncio.to_thread(run)
    assert done.returncode != 0
    assert "refused the credentials" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
