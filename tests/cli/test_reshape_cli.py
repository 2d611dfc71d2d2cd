"""``tidelog stream add-partitions``, ``tidelog stream alter`` and ``tidelog cluster rebalance`` against a real
broker, as a user types them: tables for people, JSON for scripts, one-line refusals.

The commands run in-process through click's runner, each on a thread of its own (it runs its own event loop, as
it does for a user), against the broker fixture on this module's loop: no interpreter start per command.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from click.testing import CliRunner, Result

from tests.broker.conftest import broker, broker_settings, stream_name
from tests.helpers import BOUND
from tidelog.cli.main import cli
from tidelog.server import Broker

__all__ = ["broker", "broker_settings", "stream_name"]

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def tidelog(broker: Broker, *args: str) -> Result:
    assert broker.wire is not None
    env = {"TIDELOG_BROKERS": f"127.0.0.1:{broker.wire.port}", "COLUMNS": "200"}

    def run() -> Result:
        return CliRunner().invoke(cli, list(args), env=env)

    return await asyncio.wait_for(asyncio.to_thread(run), BOUND)


def refused(result: Result, *words: str) -> None:
    """A refusal: non-zero, one line naming what was wrong, no traceback."""
    assert result.exit_code != 0, result.output
    message = str(result.exception) if result.exception and not isinstance(result.exception, SystemExit) else ""
    text = result.output + message
    assert "Traceback" not in text
    for word in words:
        assert word in text, text


async def test_add_partitions_table_json_and_refusals(broker: Broker) -> None:
    assert (await tidelog(broker, "stream", "create", "grow", "--subject", "grow.in")).exit_code == 0

    added = await tidelog(broker, "stream", "add-partitions", "grow", "--to", "3")
    assert added.exit_code == 0, added.output
    assert "1 → 3 partitions" in added.stdout and "grow.in.1, grow.in.2" in added.stdout
    assert [line.split()[0] for line in added.stdout.splitlines() if line.split()[-1:] == ["active"]] == ["1", "2"]

    scripted = await tidelog(broker, "stream", "add-partitions", "grow", "--to", "4", "-o", "json")
    assert scripted.exit_code == 0, scripted.output
    document = json.loads(scripted.stdout)
    assert (document["before"], document["after"]) == (3, 4)
    assert [p["id"] for p in document["added"]] == [3]

    refused(await tidelog(broker, "stream", "add-partitions", "grow", "--to", "2"), "cannot shrink", "only be added")
    refused(await tidelog(broker, "stream", "add-partitions", "grow", "--to", "0"), "--to")
    refused(await tidelog(broker, "stream", "add-partitions", "grow"), "--to")


async def test_alter_table_json_and_refusals(broker: Broker) -> None:
    assert (await tidelog(broker, "stream", "create", "tune")).exit_code == 0

    changed = await tidelog(broker, "stream", "alter", "tune", "--set", "retention_max_age_ms=60000")
    assert changed.exit_code == 0, changed.output
    row = next(line.split() for line in changed.stdout.splitlines() if "retention_max_age_ms" in line)
    assert row == ["retention_max_age_ms", "(default)", "60000"]

    scripted = await tidelog(
        broker, "stream", "alter", "tune", "--set", "retention.max.age.ms=default", "--set", "min.isr=1", "-o", "json"
    )
    assert scripted.exit_code == 0, scripted.output
    changes = {c["name"]: (c["before"], c["after"]) for c in json.loads(scripted.stdout)["changes"]}
    assert changes == {"retention_max_age_ms": ("60000", ""), "min_isr": ("", "1")}

    refused(await tidelog(broker, "stream", "alter", "tune", "--set", "encryption=true"), "encryption", "cannot change")
    refused(await tidelog(broker, "stream", "alter", "tune", "--set", "retention"), "KEY=VALUE")
    refused(await tidelog(broker, "stream", "alter", "tune", "--set", "a=1", "--set", "a=2"), "set twice")
    refused(await tidelog(broker, "stream", "alter", "tune", "--set", "colour=red"), "unknown stream setting 'colour'")
    refused(await tidelog(broker, "stream", "alter", "tune"), "--set")


async def test_rebalance_reports_what_moved(broker: Broker) -> None:
    shown = await tidelog(broker, "cluster", "rebalance")
    assert shown.exit_code == 0, shown.output
    assert "leaderships moved" in shown.stdout
    scripted = await tidelog(broker, "cluster", "rebalance", "-o", "json")
    assert scripted.exit_code == 0, scripted.output
    assert json.loads(scripted.stdout) == {"moved": 0, "not_preferred": 0}
