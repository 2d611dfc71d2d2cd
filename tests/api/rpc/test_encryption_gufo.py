"""A Liftbridge client written by others (``gufo-liftbridge``) on a broker that encrypts new streams by default
(``default_encryption``): it creates, publishes and subscribes unchanged, and the values are not on disk.

gufo-liftbridge cannot ask for ``encryption`` itself (its ``create_stream`` has no such option): the broker
default decides. It runs in a process of its own (its generated ``api.proto`` and tidelog's cannot share one
protobuf descriptor pool).
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import os
import sys
from typing import Any

import pytest

from tests.broker.conftest import broker, stream_name
from tests.broker.helpers import SECRET, stored
from tests.helpers import BOUND
from tidelog.server import Broker

__all__ = ["broker", "stream_name"]

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
from gufo.liftbridge.types import AckPolicy, StartPosition

async def main(address, stream, secret):
    async with LiftbridgeClient([address]) as client:
        await client.create_stream(stream, wait_for_stream=True)
        for i in range(3):
            await client.publish(secret + str(i).encode(), stream=stream, ack_policy=AckPolicy.ALL)
        got = []
        async for message in client.subscribe(stream, start_position=StartPosition.EARLIEST):
            got.append(message.value.decode())
            if len(got) == 3:
                break
    print(json.dumps(got))

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3].encode()))
"""


@pytest.fixture(scope="module")
def broker_settings() -> dict[str, Any]:
    return {"encryption_key": base64.b64encode(os.urandom(32)).decode(), "default_encryption": True}


async def test_gufo_liftbridge_reads_and_writes_an_encrypted_stream(broker: Broker, stream_name: str) -> None:
    assert broker.grpc is not None and broker.mirror is not None and broker.manager is not None
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CLIENT,
        f"127.0.0.1:{broker.grpc.port}",
        stream_name,
        SECRET.decode(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), BOUND)
    except TimeoutError:
        process.kill()  # by its PID; it retries some errors forever
        await process.wait()
        raise AssertionError("the gufo-liftbridge client did not finish in time") from None
    assert process.returncode == 0, err.decode(errors="replace")[-2000:]
    assert json.loads(out) == [SECRET.decode() + str(i) for i in range(3)]
    stream = broker.mirror.snapshot.stream(stream_name)
    assert stream is not None and stream.config.encryption
    await broker.manager.leader_of(stream_name, 0).log.flush()
    on_disk = stored(broker.config.data_dir, stream_name)
    assert on_disk and SECRET not in on_disk
