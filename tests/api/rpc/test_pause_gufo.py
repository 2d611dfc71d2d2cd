"""Pause and auto-pause from a Liftbridge client written by others: ``gufo-liftbridge`` (the ``dev`` extra)
creates a stream with ``auto_pause_time``, which the broker honours; its ``subscribe(resume=True)`` then resumes
the auto-paused partition and reads what it held, and its ``publish`` resumes a paused one.

The client runs in a process of its own (its generated ``api.proto`` and tidelog's cannot share one protobuf
descriptor pool), as in :mod:`tests.api.rpc.test_cursors_gufo`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys

import pytest

from tests.broker.conftest import broker, broker_settings, stream_name, stub
from tests.broker.helpers import Stub, bounded, partition_metadata
from tests.helpers import BOUND
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.protocol._gen import api_pb2
from tidelog.server import Broker

__all__ = ["broker", "broker_settings", "stream_name", "stub"]

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(
        importlib.util.find_spec("gufo") is None or importlib.util.find_spec("gufo.liftbridge") is None,
        reason="gufo-liftbridge is not installed (the dev extra)",
    ),
]

CLIENT = """
import asyncio, json, sys
from gufo.liftbridge.client import LiftbridgeClient, StartPosition

async def main(address, stream, step):
    async with LiftbridgeClient([address]) as client:
        if step == "create":
            await client.create_stream(stream, auto_pause_time=1, wait_for_stream=True)
            await client.publish(b"stored", stream=stream, partition=0)
            print(json.dumps([]))
        elif step == "subscribe":
            got = []
            async for message in client.subscribe(stream, partition=0, start_position=StartPosition.EARLIEST,
                                                  resume=True):
                got.append(message.value.decode())
                break
            print(json.dumps(got))
        else:
            await client.publish(b"resumes", stream=stream, partition=0)
            print(json.dumps([]))

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
"""


async def run_client(address: str, stream: str, step: str) -> list[str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CLIENT,
        address,
        stream,
        step,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), BOUND)
    except TimeoutError:
        process.kill()  # by its PID; it retries some errors forever
        await process.wait()
        raise AssertionError(f"the gufo-liftbridge client did not finish {step!r} in time") from None
    assert process.returncode == 0, err.decode(errors="replace")[-2000:]
    answer: list[str] = json.loads(out)
    return answer


async def until_paused(broker: Broker, stream: str) -> None:
    assert broker.mirror is not None

    def done(snap: MetadataSnapshot) -> bool:
        record = snap.partition(stream, 0)
        return record is not None and record.paused

    await broker.mirror.wait_for(done, BOUND)


async def test_gufo_liftbridge_auto_pause_then_subscribe_with_resume(
    broker: Broker, stub: Stub, stream_name: str
) -> None:
    assert broker.grpc is not None
    address = f"127.0.0.1:{broker.grpc.port}"
    await run_client(address, stream_name, "create")
    await until_paused(broker, stream_name)  # its autoPauseTime of one second, honoured

    assert await run_client(address, stream_name, "subscribe") == ["stored"]
    assert not (await partition_metadata(stub, stream_name)).paused

    await bounded(stub.PauseStream(api_pb2.PauseStreamRequest(name=stream_name)))
    await run_client(address, stream_name, "publish")
    assert not (await partition_metadata(stub, stream_name)).paused
