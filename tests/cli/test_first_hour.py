"""What a new user meets first, against a real ``tidelog serve`` (issue 19): one-line errors for bad input,
creation that refuses a different stream, ``--offset`` that never becomes another offset, message size limits,
``publish --nats``, ``--acks none`` and empty input, headers and ``--since`` in ``subscribe``, JSON listings.

Each command runs as its own process through the ``tidelog`` entry point, as a user types it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.helpers import BOUND
from tidelog.local.serve_process import TIDELOG, ServedBroker, clean_env, start_served_broker

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

TIMEOUT = 60.0
MB2 = 2_000_000
MB6 = 6_000_000


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def broker(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ServedBroker]:
    served = await start_served_broker(tmp_path_factory.mktemp("first-hour"))
    try:
        yield served
    finally:
        await served.stop()


async def tidelog(
    broker: ServedBroker, *args: str, stdin: bytes | None = None, columns: int = 200, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run one ``tidelog`` command (off the event loop) pointed at ``broker``."""
    environment = clean_env(TIDELOG_BROKERS=broker.wire_address, NATS_URL=broker.nats_url, COLUMNS=str(columns))
    environment.update(env)

    def run() -> subprocess.CompletedProcess[str]:
        completed = subprocess.run(
            [str(TIDELOG), *args], input=stdin, capture_output=True, timeout=TIMEOUT, env=environment
        )
        return subprocess.CompletedProcess(
            completed.args, completed.returncode, completed.stdout.decode(), completed.stderr.decode()
        )

    return await asyncio.to_thread(run)


def one_line_error(result: subprocess.CompletedProcess[str], status: int, *parts: str) -> None:
    assert result.returncode == status, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    for part in parts:
        assert part in result.stderr, result.stderr


async def records(broker: ServedBroker, stream: str, *args: str) -> list[dict[str, object]]:
    read = await tidelog(broker, "subscribe", stream, "--earliest", "--stop-at-end", "--format", "json", *args)
    assert read.returncode == 0, read.stderr
    return [json.loads(line) for line in read.stdout.splitlines()]


# ---- item 7: bad input is one line, naming what was wrong and what is allowed ----


async def test_bad_input_is_one_line_naming_what_is_allowed(broker: ServedBroker) -> None:
    one_line_error(await tidelog(broker, "stream", "list", "-b", "127.0.0.1"), 2, "'127.0.0.1' is not HOST:PORT")
    one_line_error(await tidelog(broker, "stream", "list", TIDELOG_BROKERS="nohost"), 2, "HOST:PORT")
    one_line_error(await tidelog(broker, "stream", "create", ""), 2, "a stream name cannot be empty")
    one_line_error(await tidelog(broker, "stream", "create", "x", "-r", "-3"), 2, "-3 replicas", "-1 for every broker")
    one_line_error(await tidelog(broker, "stream", "create", "x", "-p", "0"), 2, "--partitions", "1<=x<=10000")
    one_line_error(await tidelog(broker, "subscribe", "x", "--since", "yesterday"), 2, "30s, 5m, 2h, 1d")
    one_line_error(await tidelog(broker, "publish", "x", "y", "--subject", "a.b"), 2, "only applies with --nats")
    one_line_error(await tidelog(broker, "publish", "x", "y", "--nats", "--acks", "none"), 2, "--acks", "with --nats")
    one_line_error(await tidelog(broker, "subscribe", "x", "--earliest", "--offset", "3"), 2, "two start positions")
    one_line_error(await tidelog(broker, "serve", "-s", "no_such=1"), 2, "unknown setting 'no_such'")
    one_line_error(await tidelog(broker, "stream", "frobnicate"), 2, "No such command", "tidelog stream --help")


async def test_the_grpc_port_is_named_with_the_wire_port_to_use(broker: ServedBroker) -> None:
    result = await tidelog(broker, "stream", "list", "-b", f"127.0.0.1:{broker.port}")
    one_line_error(result, 1, f"127.0.0.1:{broker.port} is a broker's gRPC port", "wire port, 9293 by default")


async def test_debug_shows_the_traceback(broker: ServedBroker) -> None:
    result = await tidelog(broker, "--debug", "stream", "list", "-b", f"127.0.0.1:{broker.port}")
    assert result.returncode == 1 and "Traceback" in result.stderr


async def test_the_broker_names_a_bad_header_field(broker: ServedBroker) -> None:
    """What the CLI cannot catch (another client's request) comes back naming the field, not ``$[3]``."""
    from tidelog.client import Admin
    from tidelog.protocol.errors import TidelogError

    async with Admin(broker.wire_address) as admin:
        with pytest.raises(TidelogError) as refused:
            await asyncio.wait_for(admin.create_stream("fh-bad-rf", replication_factor=-3), BOUND)
    assert "field replication_factor" in refused.value.message and "$[" not in refused.value.message


# ---- item 4: creating an existing stream ----


async def test_creating_an_existing_stream_with_other_settings_is_refused(broker: ServedBroker) -> None:
    created = await tidelog(broker, "stream", "create", "fh-orders", "--partitions", "3")
    assert created.returncode == 0 and "created stream fh-orders" in created.stdout, created.stderr
    same = await tidelog(broker, "stream", "create", "fh-orders", "--partitions", "3")
    assert same.returncode == 0 and "already exists with these settings" in same.stdout, same.stderr

    other = await tidelog(broker, "stream", "create", "fh-orders", "--partitions", "5")
    one_line_error(other, 1, "fh-orders", "partitions 3 (asked for 5)")
    tuned = await tidelog(broker, "stream", "create", "fh-orders", "-p", "3", "--retention-max-bytes", "1000000")
    one_line_error(tuned, 1, "retention.max.bytes the broker default (asked for 1000000)")

    described = await tidelog(broker, "stream", "describe", "fh-orders", "--output", "json")
    assert len(json.loads(described.stdout)["partitions"]) == 3


# ---- item 6: --offset past the end ----


async def test_an_offset_past_the_end_is_an_error_not_a_replay(broker: ServedBroker) -> None:
    assert (await tidelog(broker, "stream", "create", "fh-offsets")).returncode == 0
    assert (await tidelog(broker, "publish", "fh-offsets", "a", "b", "c")).returncode == 0
    past = await tidelog(broker, "subscribe", "fh-offsets", "-p", "0", "--offset", "999", "--format", "value")
    one_line_error(past, 1, "offset 999", "[0, 3]", "--earliest or --latest")
    assert past.stdout == ""  # nothing replayed from 0
    inside = await tidelog(
        broker, "subscribe", "fh-offsets", "-p", "0", "--offset", "1", "-n", "2", "--format", "value"
    )
    assert inside.stdout.splitlines() == ["b", "c"]


# ---- item 5: max_message_bytes per message on the native path ----


async def test_messages_above_max_message_bytes_are_refused_naming_setting_limit_and_size(
    broker: ServedBroker,
) -> None:
    assert (await tidelog(broker, "stream", "create", "fh-big")).returncode == 0
    for size in (MB2, MB6):
        line = b"x" * size + b"\n"
        refused = await tidelog(broker, "publish", "fh-big", stdin=b"small\n" + line + b"after\n")
        one_line_error(refused, 1, f"line 2 of standard input is {size} bytes", "max_message_bytes (1048576")
        # The client's check let through: the broker refuses it by the message's size, not a batch's.
        allowed = await tidelog(broker, "publish", "fh-big", "--max-message-bytes", str(8 << 20), stdin=line)
        one_line_error(allowed, 1, f"is {size} bytes", "above max_message_bytes (1048576)")
        assert "decompress" not in allowed.stderr
    assert [r["value"] for r in await records(broker, "fh-big")] == ["small", "small"]


async def test_a_raised_max_message_bytes_takes_two_mb_and_refuses_six(tmp_path: Path) -> None:
    """``serve -s max_message_bytes=...`` is honoured: 2 MB is stored, 6 MB refused naming the new limit."""
    raised = await start_served_broker(tmp_path, "-s", "max_message_bytes=4194304")
    try:
        assert (await tidelog(raised, "stream", "create", "fh-raised")).returncode == 0
        limit = ("--max-message-bytes", "4194304")
        stored = await tidelog(raised, "publish", "fh-raised", *limit, stdin=b"y" * MB2 + b"\n")
        assert stored.returncode == 0, stored.stderr
        too_big = await tidelog(raised, "publish", "fh-raised", "--max-message-bytes", str(8 << 20), stdin=b"y" * MB6)
        one_line_error(too_big, 1, f"record 0 is {MB6} bytes", "above max_message_bytes (4194304)")
        assert [len(str(r["value"])) for r in await records(raised, "fh-raised")] == [MB2]
    finally:
        await raised.stop()


# ---- item 11 and publish --nats ----


async def test_acks_none_and_empty_input_say_what_happened(broker: ServedBroker) -> None:
    assert (await tidelog(broker, "stream", "create", "fh-acks")).returncode == 0
    none = await tidelog(broker, "publish", "fh-acks", "a", "--acks", "none")
    assert none.returncode == 0 and "without acknowledgement" in none.stderr and "-1" not in none.stderr
    empty = await tidelog(broker, "publish", "fh-acks", stdin=b"")
    assert empty.returncode == 0 and "nothing published to fh-acks" in empty.stderr, empty.stderr
    assert "partitions )" not in empty.stderr


async def test_subscribe_shows_headers_and_starts_at_a_duration_ago(broker: ServedBroker) -> None:
    assert (await tidelog(broker, "stream", "create", "fh-headers")).returncode == 0
    sent = await tidelog(broker, "publish", "fh-headers", "v", "-k", "k1", "-H", "source=test", "-H", "n=1")
    assert sent.returncode == 0, sent.stderr
    text = await tidelog(broker, "subscribe", "fh-headers", "--earliest", "--stop-at-end")
    assert "key=k1 headers: source=test, n=1] v" in text.stdout, text.stdout
    recent = await tidelog(broker, "subscribe", "fh-headers", "--since", "5m", "--stop-at-end", "--format", "value")
    assert recent.stdout.splitlines() == ["v"], recent.stderr
    future = await tidelog(broker, "subscribe", "fh-headers", "--since", "2200-01-01", "--stop-at-end")
    assert future.returncode == 0 and future.stdout == ""
    one_line_error(await tidelog(broker, "subscribe", "fh-headers", "--since", "2999-01-01"), 2, "1970 to 2262")


async def test_publish_nats_lands_in_the_stream_partition_by_partition(broker: ServedBroker) -> None:
    created = await tidelog(broker, "stream", "create", "fh-nats", "--subject", "fh.nats", "--partitions", "2")
    assert created.returncode == 0, created.stderr
    first = await tidelog(broker, "publish", "fh-nats", "--nats", "one", "two")
    assert first.returncode == 0 and "sent 2 plain NATS message(s) to subject fh.nats" in first.stderr, first.stderr
    second = await tidelog(broker, "publish", "fh-nats", "--nats", "-p", "1", "-H", "h=v", stdin=b"three\n")
    assert second.returncode == 0 and "subject fh.nats.1" in second.stderr, second.stderr
    raw = await tidelog(broker, "publish", "fh-nats", "--nats", "--subject", "fh.nats", "four")
    assert raw.returncode == 0, raw.stderr

    deadline = time.monotonic() + BOUND
    found: list[dict[str, object]] = []
    while time.monotonic() < deadline:  # NATS ingest is asynchronous: no acknowledgement to wait on
        found = await records(broker, "fh-nats")
        if len(found) == 4:
            break
        await asyncio.sleep(0.2)
    by_partition = {(r["partition"], r["value"]) for r in found}
    assert by_partition == {(0, "one"), (0, "two"), (1, "three"), (0, "four")}, found
    assert next(r for r in found if r["value"] == "three")["headers"] == {"h": "v"}

    unreachable = await tidelog(broker, "publish", "fh-nats", "--nats", "x", NATS_URL="nats://127.0.0.1:1")
    one_line_error(unreachable, 1, "cannot reach NATS at nats://127.0.0.1:1", "--nats-url")
    no_such = await tidelog(broker, "publish", "fh-nats", "--nats", "-p", "2", "x")
    one_line_error(no_such, 2, "fh-nats has partitions 0-1, not 2")


async def test_listings_take_output_json_and_fit_80_columns(broker: ServedBroker) -> None:
    assert (await tidelog(broker, "stream", "create", "fh-listed", "-p", "2")).returncode == 0
    listed = await tidelog(broker, "stream", "list", "--prefix", "fh-listed", "--output", "json")
    assert json.loads(listed.stdout) == [
        {"name": "fh-listed", "subject": "fh-listed", "partitions": 2, "replication_factor": 1}
    ]
    described = await tidelog(broker, "stream", "describe", "fh-listed", "-o", "json")
    info = json.loads(described.stdout)
    assert [p["id"] for p in info["partitions"]] == [0, 1] and info["partitions"][0]["log_end"] == 0
    for args in (("stream", "list"), ("stream", "describe", "fh-listed")):
        table = await tidelog(broker, *args, columns=80)
        assert table.returncode == 0, table.stderr
        assert max(map(len, table.stdout.splitlines())) <= 80 and "…" not in table.stdout, table.stdout
