"""``tidelog group list|describe|reset-offsets|delete`` against a real ``tidelog serve``, as a user types them.

Members join through the wire protocol's group ops (what a native group consumer sends); committed offsets are
the group's cursors, read back with ``Admin.fetch_cursor``. The broker keeps members for two minutes without a
heartbeat, so a slow machine never loses them mid-test; they leave explicitly.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.helpers import BOUND, LONG_BOUND
from tidelog.client import Admin, Producer
from tidelog.local.serve_process import TIDELOG, ServedBroker, clean_env, start_served_broker
from tidelog.protocol.connection import Connection
from tidelog.protocol.errors import TidelogError
from tidelog.protocol.group_messages import JoinGroupRequest, LeaveGroupRequest

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

TIMEOUT = 60.0
SETTINGS = {"group_consumer_timeout_ms": "120000"}
T0 = 1_700_000_000 * 1_000_000_000  # record timestamps of the reset tests: T0 + i seconds


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def broker(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ServedBroker]:
    served = await start_served_broker(tmp_path_factory.mktemp("groups"), **SETTINGS)
    try:
        yield served
    finally:
        await served.stop()


async def tidelog(broker: ServedBroker, *args: str, columns: int = 200) -> subprocess.CompletedProcess[str]:
    """Run one ``tidelog`` command (off the event loop) pointed at ``broker``."""
    env = clean_env(TIDELOG_BROKERS=broker.wire_address, COLUMNS=str(columns))

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(TIDELOG), *args], capture_output=True, text=True, timeout=TIMEOUT, env=env)

    return await asyncio.to_thread(run)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.returncode, result.stderr)
    return result.stdout


def one_line_error(result: subprocess.CompletedProcess[str], status: int, *parts: str) -> None:
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    for part in parts:
        assert part in result.stderr, result.stderr


async def filled_stream(broker: ServedBroker, name: str, counts: list[int], later: int = 0) -> None:
    """A stream with ``counts[p]`` records in partition p, record i stamped T0 + i s; then ``later`` more records in
    partition 0 stamped an hour on."""
    async with Admin(broker.wire_address) as admin:
        await admin.create_stream(name, partitions=len(counts))
    async with Producer(broker.wire_address) as producer:
        for p, count in enumerate(counts):
            for i in range(count):
                await producer.send(name, b"v", partition=p, timestamp=T0 + i * 1_000_000_000)
        for i in range(later):
            await producer.send(name, b"late", partition=0, timestamp=T0 + (3600 + i) * 1_000_000_000)
        await producer.flush()


async def committed(broker: ServedBroker, stream: str, group: str, partitions: int) -> list[int]:
    async with Admin(broker.wire_address) as admin:
        return [await admin.fetch_cursor(stream, p, group) for p in range(partitions)]


async def cursors_served(broker: ServedBroker) -> None:
    """Wait (bounded) until a restarted broker leads ``__cursors`` again and answers cursor requests."""
    deadline = time.monotonic() + LONG_BOUND
    while True:
        try:
            await committed(broker, "gd-orders", "gd-other", 1)
            return
        except TidelogError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.2)


async def reset(broker: ServedBroker, group: str, *args: str) -> list[dict[str, object]]:
    out = json.loads(ok(await tidelog(broker, "group", "reset-offsets", group, *args, "-o", "json")))
    assert out["group_id"] == group and out["dry_run"] == ("--dry-run" in args)
    offsets: list[dict[str, object]] = out["offsets"]
    return offsets


async def test_list_and_describe_show_members_assignments_offsets_and_lag(broker: ServedBroker) -> None:
    await filled_stream(broker, "gl-orders", [10, 5, 0])
    group = "gl-group"
    async with Admin(broker.wire_address) as admin:
        await admin.set_cursor("gl-orders", 0, group, 4)
    connection = await Connection.open("127.0.0.1", broker.wire_port)
    try:
        for member in ("m1", "m2"):
            await connection.request(JoinGroupRequest(group, member, ("gl-orders",)), timeout=BOUND)

        listed = json.loads(ok(await tidelog(broker, "group", "list", "-o", "json")))
        (summary,) = [g for g in listed if g["group_id"] == group]
        assert summary["members"] == 2 and summary["coordinator"] and summary["epoch"] > 0
        table = ok(await tidelog(broker, "group", "list", columns=80))
        assert group in table and max(map(len, table.splitlines())) <= 80

        view = json.loads(ok(await tidelog(broker, "group", "describe", group, "-o", "json")))
        assert [m["consumer_id"] for m in view["members"]] == ["m1", "m2"]
        rows = view["partitions"]
        assert [(r["stream"], r["partition"]) for r in rows] == [("gl-orders", p) for p in range(3)]
        assert [(r["committed"], r["end"], r["lag"]) for r in rows] == [(4, 10, 6), (None, 5, None), (None, 0, None)]
        assert {r["member"] for r in rows} == {"m1", "m2"}  # every partition assigned, to both members
        shown = ok(await tidelog(broker, "group", "describe", group, columns=80))
        assert "m1" in shown and "lag" in shown and max(map(len, shown.splitlines())) <= 80, shown

        refused = await tidelog(broker, "group", "reset-offsets", group, "--to-earliest")
        one_line_error(refused, 1, "2 live member(s)", "m1")
        one_line_error(await tidelog(broker, "group", "delete", group, "--yes"), 1, "live member(s)")
        assert await committed(broker, "gl-orders", group, 1) == [4]  # the refusals wrote nothing
    finally:
        for member in ("m1", "m2"):
            await connection.request(LeaveGroupRequest(group, member), timeout=BOUND)
        await connection.close()

    listed = json.loads(ok(await tidelog(broker, "group", "list", "-o", "json")))
    assert group not in [g["group_id"] for g in listed]  # no members, no group record
    view = json.loads(ok(await tidelog(broker, "group", "describe", group, "-o", "json")))
    assert view["members"] == [] and view["coordinator"] is None
    assert [(r["partition"], r["committed"], r["lag"], r["member"]) for r in view["partitions"]] == [
        (0, 4, 6, None),
        (1, None, None, None),
        (2, None, None, None),
    ]
    assert "no members" in ok(await tidelog(broker, "group", "describe", group))


async def test_reset_offsets_in_each_mode_dry_run_and_for_real(broker: ServedBroker) -> None:
    stream, group = "gr-orders", "gr-group"
    await filled_stream(broker, stream, [6, 5, 0], later=4)  # partition 0: 6 records at T0.., 4 an hour on

    planned = await reset(broker, group, "--stream", stream, "--to-earliest", "--dry-run")
    assert [(r["partition"], r["committed"], r["new"]) for r in planned] == [(0, None, 0), (1, None, 0), (2, None, 0)]
    assert await committed(broker, stream, group, 3) == [-1, -1, -1]  # a dry run writes nothing

    await reset(broker, group, "--stream", stream, "--to-earliest")
    assert await committed(broker, stream, group, 3) == [0, 0, 0]

    latest = await reset(broker, group, "--to-latest")  # without --stream: every partition with an offset
    assert [r["new"] for r in latest] == [10, 5, 0] and [r["committed"] for r in latest] == [0, 0, 0]
    assert await committed(broker, stream, group, 3) == [10, 5, 0]

    await reset(broker, group, "--to-offset", "7")  # kept within each partition's bounds
    assert await committed(broker, stream, group, 3) == [7, 5, 0]

    shifted = await reset(broker, group, "--shift-by", "-3", "--dry-run")
    assert [r["new"] for r in shifted] == [4, 2, 0]
    assert await committed(broker, stream, group, 3) == [7, 5, 0]
    await reset(broker, group, "--shift-by", "-3")
    assert await committed(broker, stream, group, 3) == [4, 2, 0]

    only = await reset(broker, group, "--shift-by", "100", "--stream", stream, "--partition", "1")
    assert [(r["partition"], r["new"]) for r in only] == [(1, 5)]
    assert await committed(broker, stream, group, 3) == [4, 5, 0]

    moment = dt.datetime.fromtimestamp(T0 / 1e9 + 3.5, dt.UTC).isoformat()  # between records 3 and 4
    await reset(broker, group, "--to-datetime", moment)
    assert await committed(broker, stream, group, 3) == [4, 4, 0]
    later = dt.datetime.fromtimestamp(T0 / 1e9 + 60, dt.UTC).replace(tzinfo=None).isoformat()  # UTC by default
    await reset(broker, group, "--to-datetime", later)
    assert await committed(broker, stream, group, 3) == [6, 5, 0]  # the first record after; none: the end

    table = ok(await tidelog(broker, "group", "reset-offsets", group, "--to-earliest", "--dry-run"))
    assert "dry run" in table and "nothing written" in table
    assert await committed(broker, stream, group, 3) == [6, 5, 0]


async def test_bad_input_is_one_line(broker: ServedBroker) -> None:
    group = "gb-group"
    await filled_stream(broker, "gb-orders", [1])
    cases = [
        (["--to-earliest", "--to-latest"], 2, "--to-earliest and --to-latest are two targets"),
        (["--to-offset", "3", "--shift-by", "1"], 2, "give exactly one of"),
        ([], 2, "give one of --to-earliest"),
        (["--to-offset", "-1"], 2, "--to-offset"),
        (["--to-datetime", "yesterday"], 2, "ISO-8601"),
        (["--to-latest", "--partition", "0"], 2, "--partition needs exactly one --stream"),
        (["--to-latest"], 1, "no committed offsets"),
        (["--to-latest", "--stream", "gb-nothing"], 1, "gb-nothing"),
        (["--to-latest", "--stream", "gb-orders", "--partition", "3"], 1, "partitions 0..0, not 3"),
        (["--shift-by", "1", "--stream", "gb-orders"], 1, "needs a committed offset to shift from"),
    ]
    for args, status, says in cases:
        one_line_error(await tidelog(broker, "group", "reset-offsets", group, *args), status, says)
    one_line_error(await tidelog(broker, "group", "describe", group), 1, "no such consumer group gb-group")
    one_line_error(await tidelog(broker, "group", "delete", group, "--yes"), 1, "no such consumer group")
    one_line_error(await tidelog(broker, "group", "describe", "a/b"), 2, "'/'")
    one_line_error(await tidelog(broker, "group", "describe", ""), 2, "1 to 255")
    one_line_error(await tidelog(broker, "group", "describe", "x" * 256), 2, "256 characters")
    assert await committed(broker, "gb-orders", group, 1) == [-1]


async def test_delete_removes_every_committed_offset_also_after_a_restart(tmp_path: Path) -> None:
    """Deleted cursors are tombstones in ``__cursors``: a broker that reads them back from its log after a restart
    (its cache rebuilt) still finds them deleted."""
    served = await start_served_broker(tmp_path, **SETTINGS)
    try:
        await filled_stream(served, "gd-orders", [3, 3])
        async with Admin(served.wire_address) as admin:
            await admin.set_cursor("gd-orders", 0, "gd-group", 2)
            await admin.set_cursor("gd-orders", 1, "gd-group", 3)
            await admin.set_cursor("gd-orders", 0, "gd-other", 1)  # another group's offset stays
        out = ok(await tidelog(served, "group", "delete", "gd-group", "--yes"))
        assert "2 committed offset(s)" in out
        assert await committed(served, "gd-orders", "gd-group", 2) == [-1, -1]
        one_line_error(await tidelog(served, "group", "describe", "gd-group"), 1, "no such consumer group")
    finally:
        await served.stop()
    served = await start_served_broker(tmp_path, **SETTINGS)
    try:
        await cursors_served(served)
        assert await committed(served, "gd-orders", "gd-group", 2) == [-1, -1]
        assert await committed(served, "gd-orders", "gd-other", 1) == [1]
        one_line_error(await tidelog(served, "group", "delete", "gd-group", "--yes"), 1, "no such consumer group")
    finally:
        await served.stop()
