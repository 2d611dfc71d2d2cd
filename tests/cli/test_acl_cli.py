"""``tidelog acl add|remove|list`` against a real broker's etcd: every combination of the flags becomes one entry,
the broker's mirror sees them, ``list`` shows them (table and JSON) with any undecodable record, and bad input
is one line naming what is allowed, with nothing written."""

from __future__ import annotations

import asyncio
import json

import pytest
from click.testing import CliRunner, Result

from tests.broker.conftest import broker, broker_settings
from tests.helpers import BOUND
from tidelog.cli.main import cli
from tidelog.metadata.acl_records import acl_prefix
from tidelog.metadata.namespace import namespace_keys
from tidelog.server import Broker

__all__ = ["broker", "broker_settings"]

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def tidelog(broker: Broker, *args: str) -> Result:
    def run() -> Result:
        env = {"TIDELOG_ETCD_ENDPOINTS": ",".join(broker.etcd_endpoints), "COLUMNS": "200"}
        return CliRunner().invoke(cli, list(args), env=env)

    return await asyncio.wait_for(asyncio.to_thread(run), BOUND)


async def listed(broker: Broker, *args: str) -> dict[str, list[object]]:
    result = await tidelog(broker, "acl", "list", "-o", "json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)  # type: ignore[no-any-return]


async def test_add_list_remove(broker: Broker) -> None:
    added = await tidelog(
        broker, "acl", "add", "--allow-principal", "alice", "--allow-principal", "bob",
        "--operation", "read", "--operation", "describe", "--stream", "orders.", "--resource-pattern-type", "prefixed",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    assert added.output.count("added: allow") == 4
    denied = await tidelog(broker, "acl", "add", "--deny-principal", "*", "--operation", "delete", "--cluster")
    assert denied.exit_code == 0 and "added: deny * delete on cluster" in denied.output

    everything = await listed(broker)
    assert len(everything["entries"]) == 5 and everything["undecodable"] == []
    assert {"principal": "alice", "permission": "allow", "operation": "read", "resource": "stream",
            "name": "orders.", "pattern": "prefixed"} in everything["entries"]  # fmt: skip
    alice = await listed(broker, "--principal", "alice")
    assert len(alice["entries"]) == 3  # her two, and the one for *
    table = await tidelog(broker, "acl", "list")
    assert table.exit_code == 0 and "orders." in table.output and "prefixed" in table.output

    removed = await tidelog(
        broker, "acl", "remove", "--allow-principal", "bob", "--operation", "read", "--operation", "describe",
        "--stream", "orders.", "--resource-pattern-type", "prefixed",
    )  # fmt: skip
    assert removed.exit_code == 0 and "removed 2 of 2 entries" in removed.output
    again = await tidelog(broker, "acl", "remove", "--deny-principal", "bob", "--operation", "read", "--group", "g")
    assert again.exit_code == 0 and "removed 0 of 1 entry" in again.output
    assert len((await listed(broker))["entries"]) == 3


async def test_an_undecodable_record_is_listed(broker: Broker) -> None:
    key = acl_prefix(namespace_keys()) + b"broken"
    await broker.etcd.put(key, b"{")
    try:
        shown = await listed(broker)
        assert shown["undecodable"] == [key.decode()]
        table = await tidelog(broker, "acl", "list")
        assert "undecodable record" in table.output and "denied until removed" in table.output
    finally:
        await broker.etcd.delete(key)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--operation", "read", "--stream", "s"], "name a principal"),
        (["--allow-principal", "a", "--stream", "s"], "name an --operation: one of read, write"),
        (["--allow-principal", "a", "--operation", "read"], "name a resource: --stream, --group or --cluster"),
        (["--allow-principal", "a", "--operation", "fly", "--stream", "s"], "'fly' is not one of"),
        (
            ["--allow-principal", "a", "--operation", "read", "--cluster", "--resource-pattern-type", "prefixed"],
            "--cluster is one resource",
        ),
    ],
)
async def test_bad_input_is_one_line_and_writes_nothing(broker: Broker, args: list[str], message: str) -> None:
    before = await listed(broker)
    result = await tidelog(broker, "acl", "add", *args)
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output
    assert await listed(broker) == before


async def test_no_etcd_endpoints_is_one_line(broker: Broker) -> None:
    def run() -> Result:
        return CliRunner().invoke(cli, ["acl", "list", "--etcd-endpoints", ""], env={"TIDELOG_ETCD_ENDPOINTS": ""})

    result = await asyncio.wait_for(asyncio.to_thread(run), BOUND)
    assert result.exit_code == 2 and "no etcd endpoints" in result.output
