"""``tidelog append`` against a real broker: one transactional append per command, its table, its failures.

The command runs in-process through click's runner, on a thread of its own (it runs its own event loop, as it
does for a user), against the broker fixture on this module's loop: no interpreter start per command.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from tests.broker.conftest import broker, broker_settings, stream_name
from tests.helpers import BOUND
from tidelog.cli.append import EXPECTATION_FAILED
from tidelog.cli.main import cli
from tidelog.client import Consumer, ConsumerRecord
from tidelog.server import Broker

__all__ = ["broker", "broker_settings", "stream_name"]

pytestmark = pytest.mark.asyncio(loop_scope="module")


def address(broker: Broker) -> str:
    assert broker.wire is not None
    return f"127.0.0.1:{broker.wire.port}"


async def tidelog(broker: Broker, *args: str, stdin: str | None = None) -> Result:
    """Run one ``tidelog`` command pointed at ``broker``."""

    def run() -> Result:
        env = {"TIDELOG_BROKERS": address(broker), "COLUMNS": "200"}
        return CliRunner().invoke(cli, list(args), input=stdin, env=env)

    return await asyncio.wait_for(asyncio.to_thread(run), BOUND)


async def read_all(broker: Broker, stream: str) -> list[ConsumerRecord]:
    async with Consumer(address(broker), stream, stop_at_end=True) as consumer:
        async with asyncio.timeout(BOUND):
            return [record async for record in consumer]


def table(result: Result) -> dict[str, str]:
    """The outcome table as field → value (rich draws it with box characters)."""
    rows = {}
    for line in result.stdout.splitlines():
        cells = [cell.strip() for cell in line.strip("│┃ ").split("│")]
        if len(cells) == 2:
            rows[cells[0]] = cells[1]
    return rows


async def create(broker: Broker, stream: str) -> None:
    created = await tidelog(broker, "stream", "create", stream)
    assert created.exit_code == 0, created.output


async def test_values_arguments_and_stdin_are_each_one_append(broker: Broker, stream_name: str) -> None:
    await create(broker, stream_name)
    first = await tidelog(
        broker, "append", stream_name, "a", "b", "c", "--key", "k", "-H", "h=1", "--union-registers", "author=me"
    )
    assert first.exit_code == 0, first.output
    assert table(first) == {
        "stream": f"{stream_name} partition 0",
        "records": "3",
        "offsets": "0-2",
        "log end": "3",
        "registers": "author=me",
    }
    second = await tidelog(
        broker,
        "append",
        stream_name,
        "--expected-offset",
        "3",
        "--check-registers",
        "author=me,!frozen",
        stdin="d\ne\n",
    )
    assert second.exit_code == 0, second.output
    assert (table(second)["offsets"], table(second)["registers"]) == ("3-4", "author=me")

    records = await read_all(broker, stream_name)
    assert [(r.offset, r.value) for r in records] == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d"), (4, b"e")]
    assert [r.key for r in records] == [b"k", b"k", b"k", None, None]
    assert records[0].headers == (("h", b"1"),) and records[3].headers == ()


async def test_a_file_and_an_empty_input(broker: Broker, stream_name: str, tmp_path: Path) -> None:
    await create(broker, stream_name)
    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"line-{i}\n" for i in range(1000)))
    from_file = await tidelog(broker, "append", stream_name, "--file", str(lines), "--union-registers", "version=1")
    assert from_file.exit_code == 0, from_file.output
    assert (table(from_file)["records"], table(from_file)["offsets"]) == ("1000", "0-999")

    nothing = await tidelog(broker, "append", stream_name, "--union-registers", "version=2", stdin="")
    assert nothing.exit_code == 0, nothing.output
    assert "nothing appended" in nothing.stdout
    assert table(nothing) == {
        "stream": f"{stream_name} partition 0",
        "records": "0",
        "offsets": "-",
        "log end": "1000",
        "registers": "version=1",  # registers change only with records
    }
    assert [r.value for r in await read_all(broker, stream_name)] == [b"line-%d" % i for i in range(1000)]


async def test_a_failed_expectation_exits_3_and_says_what_the_broker_found(broker: Broker, stream_name: str) -> None:
    await create(broker, stream_name)
    taken = await tidelog(broker, "append", stream_name, "x", "y", "--union-registers", "author=a")
    assert taken.exit_code == 0, taken.output

    late = await tidelog(broker, "append", stream_name, "lost", "--expected-offset", "0")
    assert late.exit_code == EXPECTATION_FAILED == 3
    assert f"{stream_name}/0 ends at offset 2, not at the expected offset 0" in late.stderr
    assert "nothing was written" in late.stderr and "Traceback" not in late.output

    fenced = await tidelog(broker, "append", stream_name, "lost", "--check-registers", "author=b")
    assert fenced.exit_code == EXPECTATION_FAILED
    assert f"the registers of {stream_name}/0 are author=a" in fenced.stderr and "author=b" in fenced.stderr

    assert [r.value for r in await read_all(broker, stream_name)] == [b"x", b"y"]


async def test_other_failures_and_bad_usage(broker: Broker, stream_name: str) -> None:
    unknown = await tidelog(broker, "append", "no-such-stream-for-cli-appends", "x")
    assert unknown.exit_code == 1 and "no-such-stream-for-cli-appends" in unknown.stderr

    await create(broker, stream_name)
    for option, text in (
        ("--union-registers", "!author=a"),  # excludes belong in a selector
        ("--union-registers", "a=1"),  # a name of one character
        ("--check-registers", "author=a b"),  # a space in a value
    ):
        bad = await tidelog(broker, "append", stream_name, "x", option, text)
        assert bad.exit_code == 2 and option in bad.stderr, bad.output
    both = await tidelog(broker, "append", stream_name, "x", "--file", "-")
    assert both.exit_code == 2 and "not both" in both.stderr
    assert await read_all(broker, stream_name) == []
