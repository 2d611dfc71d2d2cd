"""``tidelog user add|delete|list``: the SCRAM-SHA-256 users of clients without a certificate, kept in etcd.

Only salted, hashed credentials are written (:mod:`tidelog.metadata.user_records`): the password is read from a
prompt (hidden, asked twice) or from ``--password-stdin``, never from the command line, where other users of
the host could read it in the process list. A client logs in with the user's name and password over TLS
(``Cluster(credentials=...)``, the commands' ``--user``, Spark's ``sasl.*``, or ``authorization: Basic`` on gRPC
calls and the HTTP port); what it may then do is what the ACLs allow the principal of that name.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from tidelog.cli.acl import etcd_option, run_on_etcd
from tidelog.cli.common import namespace_option, output_option
from tidelog.cli.render import console, print_json, table
from tidelog.metadata.namespace import namespace_keys
from tidelog.metadata.user_records import (
    ITERATIONS,
    USER_RULE,
    check_user_name,
    delete_user,
    list_users,
    make_user,
    put_user,
)

__all__ = ["user"]


def _name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return check_user_name(value)
    except ValueError:
        raise click.BadParameter(f"{value!r}: a user name is {USER_RULE}", ctx, param) from None


@click.group()
def user() -> None:
    """Manage SCRAM-SHA-256 users (logins for clients without a certificate)."""


@user.command("add")
@click.argument("name", callback=_name)
@click.option("--password-stdin", is_flag=True, help="Read the password from the first line of standard input.")
@click.option(
    "--iterations",
    type=click.IntRange(4096, 10_000_000),
    default=ITERATIONS,
    show_default=True,
    help="PBKDF2 iterations (more: slower logins, slower guessing).",
)
@etcd_option
@namespace_option
def add(name: str, password_stdin: bool, iterations: int, etcd_endpoints: str, namespace: str) -> None:
    """Add user NAME, or set a new password for it."""
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    if not password:
        raise click.UsageError("the password is empty: give one (a prompt, or a line on stdin with --password-stdin)")
    record = make_user(name, password, iterations)
    keys = namespace_keys(namespace)

    async def work(client: Any) -> None:
        await put_user(client, keys, record)

    run_on_etcd(etcd_endpoints, work)
    click.echo(f"user {name} saved (SCRAM-SHA-256, {iterations} iterations)")


@user.command("delete")
@click.argument("name", callback=_name)
@etcd_option
@namespace_option
def delete(name: str, etcd_endpoints: str, namespace: str) -> None:
    """Delete user NAME (its open connections stay logged in until they close)."""
    keys = namespace_keys(namespace)
    if not run_on_etcd(etcd_endpoints, lambda client: delete_user(client, keys, name)):
        raise click.ClickException(f"no user {name!r} (tidelog user list shows the users)")
    click.echo(f"user {name} deleted")


@user.command("list")
@etcd_option
@namespace_option
@output_option
def list_(etcd_endpoints: str, namespace: str, output: str) -> None:
    """Every user's name (credentials are never shown)."""
    keys = namespace_keys(namespace)
    names = run_on_etcd(etcd_endpoints, lambda client: list_users(client, keys))
    if output == "json":
        print_json({"users": names})
        return
    out = table("USER")
    for name in names:
        out.add_row(name)
    console().print(out)
