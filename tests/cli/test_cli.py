"""The ``tidelog`` command against a real broker process, as a user types it."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tidelog.local.serve_process import TIDELOG, ServedBroker, clean_env, start_served_broker

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

TIMEOUT = 60.0


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def broker(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ServedBroker]:
    served = await start_served_broker(tmp_path_factory.mktemp("cli"))
    try:
        yield served
    finally:
        await served.stop()


async def tidelog(broker: ServedBroker, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    """Run one ``tidelog`` command (off the event loop) pointed at ``broker``."""
    env = clean_env(TIDELOG_BROKERS=broker.wire_address, COLUMNS="200")

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(TIDELOG), *args],
            input=stdin.decode() if stdin is not None else None,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            env=env,
        )

    return await asyncio.to_thread(run)


async def test_create_list_describe_delete(broker: ServedBroker) -> None:
    created = await tidelog(broker, "stream", "create", "cli-orders", "--subject", "cli.orders", "--partitions", "3")
    assert created.returncode == 0, created.stderr
    assert "cli-orders" in created.stdout

    listed = await tidelog(broker, "stream", "list")
    assert listed.returncode == 0, listed.stderr
    assert "cli-orders" in listed.stdout and "cli.orders" in listed.stdout

    described = await tidelog(broker, "stream", "describe", "cli-orders")
    assert described.returncode == 0, described.stderr
    rows = [line.split() for line in described.stdout.splitlines()]
    assert [row[0] for row in rows if row and row[-1] == "active"] == ["0", "1", "2"], described.stdout

    deleted = await tidelog(broker, "stream", "delete", "cli-orders", "--yes")
    assert deleted.returncode == 0, deleted.stderr
    again = await tidelog(broker, "stream", "describe", "cli-orders")
    assert again.returncode != 0
    assert "cli-orders" in again.stderr and "Traceback" not in again.stderr


async def test_publish_arguments_and_stdin_then_subscribe(broker: ServedBroker) -> None:
    assert (await tidelog(broker, "stream", "create", "cli-pub")).returncode == 0
    first = await tidelog(broker, "publish", "cli-pub", "alpha", "beta", "--key", "k1", "--header", "source=test")
    assert first.returncode == 0, first.stderr
    lines = "".join(f"line-{i}\n" for i in range(300)).encode()
    second = await tidelog(broker, "publish", "cli-pub", stdin=lines)
    assert second.returncode == 0, second.stderr
    assert "300" in second.stderr

    read = await tidelog(broker, "subscribe", "cli-pub", "--earliest", "--stop-at-end", "--format", "json")
    assert read.returncode == 0, read.stderr
    records = [json.loads(line) for line in read.stdout.splitlines()]
    assert [r["value"] for r in records] == ["alpha", "beta", *(f"line-{i}" for i in range(300))]
    assert [r["offset"] for r in records] == list(range(302))
    assert records[0]["key"] == "k1" and records[0]["headers"] == {"source": "test"}

    window = await tidelog(
        broker, "subscribe", "cli-pub", "--offset", "100", "--max-messages", "3", "--format", "value"
    )
    assert window.stdout.splitlines() == ["line-98", "line-99", "line-100"]


async def test_errors_are_one_line_and_nonzero(broker: ServedBroker) -> None:
    unknown = await tidelog(broker, "publish", "no-such-stream", "x")
    assert unknown.returncode == 1
    assert "no-such-stream" in unknown.stderr and "Traceback" not in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1

    bad_name = await tidelog(broker, "stream", "create", "bad/name")
    assert bad_name.returncode == 1 and "bad/name" in bad_name.stderr

    unreachable = await tidelog(broker, "stream", "list", "--brokers", "127.0.0.1:1")
    assert unreachable.returncode == 1 and "Traceback" not in unreachable.stderr

    tiered_compacted = await tidelog(broker, "stream", "create", "tiered-compacted", "--compact", "--tiered")
    assert tiered_compacted.returncode == 1 and "compacted stream cannot tier" in tiered_compacted.stderr
    assert len(tiered_compacted.stderr.strip().splitlines()) == 1
    no_store = await tidelog(broker, "stream", "create", "tiered-without-store", "--tiered")
    assert no_store.returncode == 1 and "needs a tiered store" in no_store.stderr


async def test_pause_and_readonly(broker: ServedBroker) -> None:
    assert (await tidelog(broker, "stream", "create", "cli-state")).returncode == 0
    assert (await tidelog(broker, "stream", "readonly", "cli-state")).returncode == 0
    refused = await tidelog(broker, "publish", "cli-state", "x")
    assert refused.returncode == 1 and "read-only" in refused.stderr
    assert (await tidelog(broker, "stream", "readonly", "cli-state", "--off")).returncode == 0
    assert (await tidelog(broker, "publish", "cli-state", "x")).returncode == 0

    assert (await tidelog(broker, "stream", "pause", "cli-state")).returncode == 0
    described = await tidelog(broker, "stream", "describe", "cli-state")
    assert "paused" in described.stdout
    assert (await tidelog(broker, "publish", "cli-state", "wakes it")).returncode == 0
    described = await tidelog(broker, "stream", "describe", "cli-state")
    assert "paused" not in described.stdout and "active" in described.stdout


async def test_activity_tails_metadata_changes_as_a_table_and_as_json(broker: ServedBroker) -> None:
    created = await tidelog(broker, "stream", "create", "cli-activity", "--subject", "cli.activity")
    assert created.returncode == 0, created.stderr
    events: list[dict[str, object]] = []
    for _ in range(200):  # the controller publishes after the change commits: bounded polling
        result = await tidelog(broker, "activity", "--stop-at-end", "--output", "json")
        assert result.returncode == 0, result.stderr
        events = [json.loads(line) for line in result.stdout.splitlines()]
        if any(e["subject"] == "cli-activity" for e in events):
            break
        await asyncio.sleep(0.1)
    (mine,) = [e for e in events if e["subject"] == "cli-activity"]
    assert mine["op"] == "CREATE_STREAM" and mine["detail"] == "partitions 0"
    ids = [e["id"] for e in events]
    assert ids == sorted(set(ids))  # type: ignore[type-var]

    table = await tidelog(broker, "activity", "--stop-at-end")
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split()[:3] == ["OFFSET", "TIME", "(UTC)"] and "DETAIL" in header
    assert any("CREATE_STREAM" in row and "cli-activity" in row for row in rows), table.stdout

    limited = await tidelog(broker, "activity", "-n", "1", "-o", "json")
    assert limited.returncode == 0 and len(limited.stdout.splitlines()) == 1, limited.stderr


async def test_a_bad_namespace_is_one_line_naming_the_rule(broker: ServedBroker) -> None:
    result = await tidelog(broker, "cluster", "status", "--namespace", "a/b", "--etcd-endpoints", "http://127.0.0.1:1")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "letters, digits" in result.stderr, result.stderr


async def test_activity_without_the_stream_is_one_line_saying_why(tmp_path: Path) -> None:
    quiet = await start_served_broker(tmp_path, activity_stream_enabled="false")
    try:
        result = await tidelog(quiet, "activity", "--stop-at-end")
    finally:
        await quiet.stop()
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().endswith("activity_stream_enabled = false, or the controller has not created it yet")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
