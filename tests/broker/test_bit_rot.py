"""Bit rot found while a lone broker runs (issue 15): a reader never stalls on one damaged batch.

A real ``tidelog serve`` process; the test flips a byte inside a batch of a sealed segment on disk (the page
cache sees it, as it would see a decaying disk block read back), then reads the partition as users do: the
wire ``Consumer`` and gRPC ``Subscribe``. Everything before and after the damaged batch is served, the damaged
offsets are named once, and ``tidelog partition skip-damaged`` makes readers pass over them silently.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from tests.broker.helpers import EVERY, FIRST, LAST, produce_batches, rot
from tests.helpers import BOUND
from tidelog.client import Admin, Consumer
from tidelog.local.serve_process import TIDELOG, ServedBroker, clean_env, start_served_broker
from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.protocol.errors import OffsetDamagedError

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

UNDAMAGED = [o for o in EVERY if not FIRST <= o <= LAST]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ServedBroker]:
    broker = await start_served_broker(tmp_path_factory.mktemp("bitrot"))
    try:
        yield broker
    finally:
        await broker.stop()


async def rotten_stream(served: ServedBroker, name: str) -> Path:
    """A stream of BATCHES batches over several sealed segments, with one byte flipped inside batch DAMAGED's
    records; returns the damaged segment file."""
    async with Admin(served.wire_address) as admin:
        await admin.create_stream(name, config={"segment.max.bytes": 4096})
    await produce_batches(served.wire_address, name)
    return rot(served.data_dir, name)


async def consume(served: ServedBroker, name: str, **options: object) -> tuple[list[int], list[OffsetDamagedError]]:
    """Read the partition to its end with a Consumer from offset 0, carrying on after each damaged range."""
    offsets: list[int] = []
    damaged: list[OffsetDamagedError] = []
    async with Consumer(served.wire_address, name, stop_at_end=True, **options) as consumer:  # type: ignore[arg-type]
        async with asyncio.timeout(BOUND):
            while True:
                try:
                    async for record in consumer:
                        offsets.append(record.offset)
                    return offsets, damaged
                except OffsetDamagedError as exc:
                    damaged.append(exc)


async def subscribe(served: ServedBroker, name: str, start: int) -> tuple[list[int], grpc.aio.AioRpcError]:
    """Subscribe from ``start`` to the last offset; the offsets received and the status the stream ended with."""
    request = api_pb2.SubscribeRequest(
        stream=name,
        partition=0,
        startPosition=api_pb2.StartPosition.OFFSET,
        startOffset=start,
        stopPosition=api_pb2.StopPosition.STOP_OFFSET,
        stopOffset=EVERY[-1],
    )
    received: list[int] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
        call = api_pb2_grpc.APIStub(channel).Subscribe(request)
        try:
            async with asyncio.timeout(BOUND):
                async for message in call:
                    if message.value:
                        received.append(message.offset)
        except grpc.aio.AioRpcError as exc:
            return received, exc
    raise AssertionError("the subscription ended without a status")


async def skip_damaged(served: ServedBroker, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(TIDELOG), "partition", "skip-damaged", name, "0", *args, "--brokers", served.wire_address],
            capture_output=True,
            text=True,
            timeout=BOUND,
            env=clean_env(),
        )

    return await asyncio.to_thread(run)


async def test_a_consumer_reads_around_a_rotten_batch_and_is_told_once(served: ServedBroker) -> None:
    await rotten_stream(served, "rot-consumer")
    offsets, damaged = await consume(served, "rot-consumer")
    assert offsets == UNDAMAGED
    assert [(e.first, e.last, e.next_offset) for e in damaged] == [(FIRST, LAST, LAST + 1)]
    assert f"offsets {FIRST}..{LAST}" in damaged[0].message
    # A second reader is told too (nothing was confirmed), and with on_damaged="skip" reads on by itself.
    offsets, damaged = await consume(served, "rot-consumer", on_damaged="skip")
    assert (offsets, damaged) == (UNDAMAGED, [])


async def test_subscribe_ends_once_with_data_loss_naming_where_to_resume(served: ServedBroker) -> None:
    await rotten_stream(served, "rot-subscribe")
    before, status = await subscribe(served, "rot-subscribe", 0)
    assert before == list(range(FIRST))
    assert status.code() == grpc.StatusCode.DATA_LOSS
    assert f"offsets {FIRST}..{LAST}" in (status.details() or "")
    assert f"resubscribe from offset {LAST + 1}" in (status.details() or "")
    after, status = await subscribe(served, "rot-subscribe", LAST + 1)
    assert after == list(range(LAST + 1, len(EVERY)))
    assert status.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # the stop offset: the normal end


async def test_skip_damaged_confirms_and_readers_pass_over_silently(served: ServedBroker) -> None:
    await rotten_stream(served, "rot-skip")
    _, damaged = await consume(served, "rot-skip")
    assert len(damaged) == 1
    listed = await skip_damaged(served, "rot-skip")
    assert listed.returncode == 0, listed.stderr
    assert f"{FIRST}..{LAST}" in listed.stdout
    wrong = await skip_damaged(served, "rot-skip", "--from", "1", "--to", "2", "--yes")
    assert wrong.returncode != 0
    assert f"{FIRST}..{LAST}" in wrong.stderr + wrong.stdout  # names the ranges it knows
    confirmed = await skip_damaged(served, "rot-skip", "--from", str(FIRST), "--to", str(LAST), "--yes")
    assert confirmed.returncode == 0, confirmed.stderr
    offsets, damaged = await consume(served, "rot-skip")
    assert (offsets, damaged) == (UNDAMAGED, [])
    received, status = await subscribe(served, "rot-skip", 0)
    assert received == UNDAMAGED
    assert status.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
