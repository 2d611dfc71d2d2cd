"""``tidelog top``: the attention order on a made-up cluster, and one frame of a real broker under load."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from click.testing import CliRunner
from rich.console import Console

from tests.broker.conftest import broker, broker_settings, stub
from tests.broker.helpers import Stub, create_stream, producing
from tests.helpers import BOUND
from tidelog.cli.cluster import ClusterView
from tidelog.cli.main import cli
from tidelog.cli.top import frame_of, render
from tidelog.local.serve_process import TIDELOG, clean_env
from tidelog.metadata.records import BrokerRecord, PartitionRecord, StreamConfig, StreamRecord
from tidelog.protocol.messages import ListOffsetsResponse
from tidelog.server import Broker

__all__ = ["broker", "broker_settings", "stub"]  # fixtures

STREAM = "topped"


def _partition(i: int, leader: str, isr: tuple[str, ...], **fields: object) -> PartitionRecord:
    return PartitionRecord("s", i, ("a", "b", "c"), leader, isr, **fields)  # type: ignore[arg-type]


def test_partitions_are_sorted_by_what_needs_attention() -> None:
    view = ClusterView()
    view.brokers = {b: BrokerRecord(b, "127.0.0.1", 1, 2, 0) for b in ("a", "b")}  # c is gone
    view.streams = {"s": StreamRecord("s", "s", "", 6, 3, 0, StreamConfig(min_isr=2))}
    view.partitions = [
        _partition(0, "a", ("a", "b", "c")),  # ok
        _partition(1, "a", ("a", "b", "c")),  # lagging
        _partition(2, "a", ("a", "b")),  # at min ISR
        _partition(3, "c", ("c",)),  # offline: its leader is gone
        _partition(4, "a", ("a",)),  # under min ISR
        _partition(5, "b", ("a", "b", "c"), suspended="log ahead of the leader"),
    ]
    before = ClusterView(bounds={("s", i): ListOffsetsResponse(0, 10, 10) for i in range(6)})
    view.bounds = {("s", i): ListOffsetsResponse(0, 10, 30) for i in range(6)}
    view.bounds[("s", 0)] = ListOffsetsResponse(0, 30, 30)
    frame = frame_of(view, before, 2.0, 0.0, {("s", 1): 4.5})
    order = [(r.partition, r.attention) for r in frame.rows]
    assert order == [
        (3, "offline"),
        (5, "suspended"),
        (4, "under_min_isr"),
        (2, "at_min_isr"),
        (1, "lagging"),
        (0, "ok"),
    ]
    assert frame.rows[-1].records_per_second == 10.0  # 20 records in 2 seconds
    assert frame.rows[-1].lag == 0 and frame.rows[-2].lag == 20
    assert frame.counts()["offline"] == 1
    assert (frame.brokers_alive, frame.brokers_known) == (2, 3)
    assert frame.rows[-2].follower_lag_seconds == 4.5 and frame.rows[-1].follower_lag_seconds is None
    console = Console(width=200, record=True)
    console.print(render(frame))
    shown = console.export_text()
    assert "lag s" in shown and "4.5" in shown and "offline 1" in shown and "Ctrl-C" not in shown


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def under_load(broker: Broker, stub: Stub) -> AsyncIterator[str]:
    """A stream of two partitions a producer keeps writing to while the module's tests run."""
    await create_stream(stub, STREAM, partitions=2)
    async with producing(broker, STREAM, b"y" * 50):
        yield STREAM


async def _top(broker: Broker, *args: str) -> tuple[int, str]:
    """``tidelog top --once`` through click's runner, off the loop (the command runs its own event loop)."""
    runner = CliRunner()
    argv = ["top", "--once", "--interval", "1", "--data-dir", str(broker.config.data_dir), *args]
    result = await asyncio.to_thread(runner.invoke, cli, argv, env={"COLUMNS": "200"})
    return result.exit_code, result.output


@pytest.mark.asyncio(loop_scope="module")
async def test_one_frame_of_a_broker_under_load(broker: Broker, under_load: str) -> None:
    assert broker.http is not None
    metrics = f"http://127.0.0.1:{broker.http.port}"
    code, out = await _top(broker, "--output", "json", "--metrics", metrics)
    assert code == 0, out
    frame = json.loads(out)
    assert all("follower_lag_seconds" in p for p in frame["partitions"])  # none here: one broker, no followers
    assert frame["controller"] == broker.id and frame["brokers_alive"] == 1
    ours = [p for p in frame["partitions"] if p["stream"] == under_load]
    assert sorted(p["partition"] for p in ours) == [0, 1]
    for p in ours:
        assert p["leader"] == broker.id and p["isr"] == [broker.id] and p["attention"] in {"ok", "lagging"}
        assert p["log_end"] > 0 and p["records_per_second"] > 0  # the producer is writing to both
    assert frame["counts"]["offline"] == 0

    code, out = await _top(broker)
    assert code == 0, out
    assert "brokers 1/1 alive" in out and f"controller {broker.id}" in out
    assert len([line for line in out.splitlines() if under_load in line]) == 2


@pytest.mark.asyncio(loop_scope="module")
async def test_bad_input_is_one_line() -> None:
    result = await asyncio.to_thread(CliRunner().invoke, cli, ["top", "--once", "-e", "bogus:/x"])
    assert result.exit_code == 2 and "not an etcd endpoint: 'bogus:/x'" in result.output
    assert "Traceback" not in result.output
    result = await asyncio.to_thread(CliRunner().invoke, cli, ["top", "--once", "-m", "ftp://h:1", "-e", "http://h:1"])
    assert result.exit_code == 2 and "is not a broker's HTTP address: give http://HOST:PORT" in result.output


@pytest.mark.asyncio(loop_scope="module")
async def test_the_live_view_refreshes_until_ctrl_c(broker: Broker, under_load: str) -> None:
    argv = ["top", "--interval", "0.5", "--output", "json", "--data-dir", str(broker.config.data_dir)]
    process = await asyncio.create_subprocess_exec(
        str(TIDELOG), *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=clean_env()
    )
    try:
        assert process.stdout is not None
        frames = []
        for _ in range(3):  # three frames, each a JSON document on its own line
            line = await asyncio.wait_for(process.stdout.readline(), BOUND)
            assert line, (await process.stderr.read()).decode() if process.stderr else "no output"
            frames.append(json.loads(line))
        assert all(any(p["stream"] == under_load for p in f["partitions"]) for f in frames)
        assert frames[0]["at"] < frames[1]["at"] < frames[2]["at"]
        rates = [p["records_per_second"] for p in frames[2]["partitions"] if p["stream"] == under_load]
        assert all(r is not None and r > 0 for r in rates)  # measured between frames
        process.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(process.wait(), BOUND) == 0  # Ctrl-C is the normal way out
        assert b"Traceback" not in (await process.stderr.read() if process.stderr else b"")
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
