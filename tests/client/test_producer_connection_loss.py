"""A broker that goes away under a producer with requests in flight: the records fail, the producer says so
once per batch, and asyncio never logs "Future exception was never retrieved"."""

from __future__ import annotations

import asyncio
import gc
import logging
from pathlib import Path

import pytest

from tests.broker.conftest import broker_config
from tests.helpers import LONG_BOUND
from tidelog.client import Admin, Producer
from tidelog.protocol.errors import TidelogError
from tidelog.server import Broker


async def test_a_lost_broker_fails_fire_and_forget_records_without_unretrieved_futures(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broker = Broker(broker_config(tmp_path / "data"))
    await broker.start()
    stopped = False
    try:
        assert broker.wire is not None
        address = f"127.0.0.1:{broker.wire.port}"
        async with Admin(address) as admin:
            await admin.create_stream("lost", partitions=4)
        producer = Producer(address)
        in_flight = asyncio.Event()

        async def fire_and_forget() -> None:  # the futures send() returns are never awaited
            sent = 0
            while True:
                await producer.send("lost", b"x" * 100)
                sent += 1
                if sent == 2000:
                    in_flight.set()

        with caplog.at_level(logging.WARNING):
            sending = asyncio.ensure_future(fire_and_forget())
            async with asyncio.timeout(LONG_BOUND):
                await in_flight.wait()
            await broker.stop()
            stopped = True
            async with asyncio.timeout(LONG_BOUND):  # send() fails once no broker is reachable
                with pytest.raises(TidelogError, match=r"no tidelog broker reachable|closed|lost"):
                    await sending
            await producer.close()
            del sending
            for _ in range(3):
                gc.collect()
                await asyncio.sleep(0)
        assert "never retrieved" not in caplog.text
        assert "produced record(s) failed, not acknowledged" in caplog.text
    finally:
        if not stopped:
            await broker.stop()
