"""``tidelog user add|delete|list`` against a real broker's etcd: only salted hashes are stored, the stored
credentials verify the password (a SCRAM exchange against them), and bad input is one line."""

from __future__ import annotations

import asyncio
import json

import pytest
from click.testing import CliRunner, Result
from scramp import ScramClient, ScramException, ScramMechanism

from tests.broker.conftest import broker, broker_settings
from tests.helpers import BOUND
from tidelog.cli.main import cli
from tidelog.metadata.namespace import namespace_keys
from tidelog.metadata.user_records import get_user
from tidelog.server import Broker

__all__ = ["broker", "broker_settings"]

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def tidelog(broker: Broker, *args: str, stdin: str | None = None) -> Result:
    def run() -> Result:
        env = {"TIDELOG_ETCD_ENDPOINTS": ",".join(broker.etcd_endpoints), "COLUMNS": "200"}
        return CliRunner().invoke(cli, list(args), input=stdin, env=env)

    return await asyncio.wait_for(asyncio.to_thread(run), BOUND)


def logs_in(info: tuple[bytes, bytes, bytes, int], password: str) -> bool:
    server = ScramMechanism().make_server(lambda _name: info)
    client = ScramClient(["SCRAM-SHA-256"], "u", password)
    server.set_client_first(client.get_client_first())
    client.set_server_first(server.get_server_first())
    try:
        server.set_client_final(client.get_client_final())
    except ScramException:
        return False
    return True


async def test_add_list_delete(broker: Broker) -> None:
    added = await tidelog(broker, "user", "add", "app", "--password-stdin", stdin="s3cret pass\n")
    assert added.exit_code == 0 and "user app saved" in added.output, added.output
    prompted = await tidelog(broker, "user", "add", "ops", stdin="other\nother\n")
    assert prompted.exit_code == 0, prompted.output
    assert "other" not in prompted.output.replace("Password", "")  # the prompt hides what is typed

    record = await get_user(broker.etcd, namespace_keys(), "app")
    assert record is not None
    assert logs_in(record.auth_info(), "s3cret pass") and not logs_in(record.auth_info(), "s3cret")
    stored = bytes((await broker.etcd.get(f"{namespace_keys().prefix}/users/app".encode())).value)
    assert b"s3cret" not in stored

    listed = await tidelog(broker, "user", "list", "-o", "json")
    assert json.loads(listed.output) == {"users": ["app", "ops"]}
    table = await tidelog(broker, "user", "list")
    assert "app" in table.output and "salt" not in table.output

    deleted = await tidelog(broker, "user", "delete", "ops")
    assert deleted.exit_code == 0 and "user ops deleted" in deleted.output
    again = await tidelog(broker, "user", "delete", "ops")
    assert again.exit_code == 1 and "no user 'ops'" in again.output


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["user", "add", "bad name", "--password-stdin"], "pw\n", "a user name is 1-128 characters"),
        (["user", "add", "app2", "--password-stdin"], "\n", "the password is empty"),
        (["user", "add", "app3", "--password-stdin", "--iterations", "10"], "pw\n", "10 is not in the range"),
    ],
)
async def test_bad_input_is_one_line(broker: Broker, args: list[str], stdin: str, message: str) -> None:
    result = await tidelog(broker, *args, stdin=stdin)
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output
    assert (await get_user(broker.etcd, namespace_keys(), args[2])) is None
