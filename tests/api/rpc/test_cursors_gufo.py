"""Cursors from a Liftbridge client written by others: ``gufo-liftbridge`` (the ``dev`` extra) stores and reads a
cursor on a real broker. It finds the leader of ``__cursors`` partition 0 in FetchMetadata, so it works with the
default of one ``__cursors`` partition; its ``set_cursor`` stores ``offset + 1`` (the next offset to read).

The client runs in a process of its own: its generated ``api.proto`` and tidelog's cannot share one protobuf
descriptor pool (same file name, different options), which is how it runs in real use anyway.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys

import pytest

from tests.broker.conftest import broker, broker_settings, stream_name, stub
from tests.broker.helpers import Stub, bounded, create_stream
from tests.helpers import BOUND
from tidelog.protocol._gen import api_pb2
from tidelog.protocol.cursors import CURSORS_STREAM
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
from gufo.liftbridge.client import LiftbridgeClient

async def main(address, stream):
    async with LiftbridgeClient([address]) as client:
        await client.wait_for_cursors()
        before = await client.get_cursor(stream, 0, "gufo")
        await client.set_cursor(stream, 0, "gufo", 41)
        after = await client.get_cursor(stream, 0, "gufo")
    print(json.dumps([before, after]))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def run_client(address: str, stream: str) -> list[int]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT, address, stream, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), BOUND)
    except TimeoutError:
        process.kill()  # by its PID; it retries some errors forever
        await process.wait()
        raise AssertionError("the gufo-liftbridge client did not finish in time") from None
    assert process.returncode == 0, err.decode(errors="replace")[-2000:]
    answer: list[int] = json.loads(out)
    return answer


async def test_gufo_liftbridge_sets_and_gets_a_cursor(broker: Broker, stub: Stub, stream_name: str) -> None:
    assert broker.grpc is not None and broker.mirror is not None
    await create_stream(stub, stream_name)
    await broker.mirror.wait_for(lambda s: s.stream(CURSORS_STREAM) is not None, BOUND)

    assert await run_client(f"127.0.0.1:{broker.grpc.port}", stream_name) == [-1, 42]

    request = api_pb2.FetchCursorRequest(stream=stream_name, partition=0, cursorId="gufo")
    assert (await bounded(stub.FetchCursor(request))).offset == 42
