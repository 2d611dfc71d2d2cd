"""``tidelog acl add|remove|list``: the cluster's ACL entries, kept in etcd, with Kafka-like flags.

The entries are written to etcd directly (as ``cluster status`` reads it): every broker follows them through
its watch, so a change reaches the whole cluster within a second, and nothing is kept in a file that could differ
between hosts. Whoever may write the cluster's etcd keys may change the ACLs: protect etcd with its own
authentication (docs/security.md).

``add`` and ``remove`` take one or more principals (``--allow-principal`` or ``--deny-principal``; ``*`` is
everyone), one or more ``--operation``, and the resources (``--stream``, ``--group``, repeatable, and/or
``--cluster``), and act on every combination; ``--resource-pattern-type prefixed`` makes the names prefixes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import click

from tidelog.broker.config_values import parse_etcd_endpoint
from tidelog.cli.common import local_etcd_endpoints, namespace_option, output_option
from tidelog.cli.render import console, print_json, table
from tidelog.metadata.acl_records import (
    CLUSTER_NAME,
    AclEntry,
    Operation,
    Pattern,
    Permission,
    ResourceType,
    add_acl,
    list_acls,
    remove_acls,
)
from tidelog.metadata.etcd_client import etcd_target, open_etcd
from tidelog.metadata.namespace import namespace_keys

__all__ = ["acl", "etcd_option", "run_on_etcd"]

ETCD_ENV = "TIDELOG_ETCD_ENDPOINTS"
ETCD_TIMEOUT = 10.0
T = TypeVar("T")


@click.group()
def acl() -> None:
    """Manage the ACL entries that authorize requests (authz_enabled)."""


def etcd_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--etcd-endpoints",
        "-e",
        default=lambda: os.environ.get(ETCD_ENV) or local_etcd_endpoints(),
        show_default=f"${ETCD_ENV}, else those of the broker on <data-dir>",
        help="Comma-separated etcd endpoints of the cluster (the first that answers is used).",
    )(f)


def _entry_options(f: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--allow-principal", multiple=True, help="A principal to allow (* for everyone); repeatable."),
        click.option("--deny-principal", multiple=True, help="A principal to deny (* for everyone); repeatable."),
        click.option(
            "--operation",
            "operations",
            multiple=True,
            type=click.Choice([o.value for o in Operation], case_sensitive=False),
            help="An operation; repeatable.",
        ),
        click.option("--stream", "streams", multiple=True, help="A stream name (or prefix); repeatable."),
        click.option("--group", "groups", multiple=True, help="A consumer group id (or prefix); repeatable."),
        click.option("--cluster", "on_cluster", is_flag=True, help="The cluster itself (listing, subject publish)."),
        click.option(
            "--resource-pattern-type",
            "pattern",
            type=click.Choice([p.value for p in Pattern], case_sensitive=False),
            default=Pattern.LITERAL.value,
            show_default=True,
            help="literal: the names exactly (* is every name); prefixed: every name starting with them.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _entries(
    allow: Sequence[str],
    deny: Sequence[str],
    operations: Sequence[str],
    streams: Sequence[str],
    groups: Sequence[str],
    on_cluster: bool,
    pattern: str,
) -> list[AclEntry]:
    if not allow and not deny:
        raise click.UsageError("name a principal: --allow-principal or --deny-principal (* for everyone)")
    if not operations:
        raise click.UsageError(f"name an --operation: one of {', '.join(o.value for o in Operation)}")
    resources = [(ResourceType.STREAM, s) for s in streams] + [(ResourceType.GROUP, g) for g in groups]
    if on_cluster:
        resources.append((ResourceType.CLUSTER, CLUSTER_NAME))
    if not resources:
        raise click.UsageError("name a resource: --stream, --group or --cluster")
    kind = Pattern(pattern.lower())
    if on_cluster and kind is Pattern.PREFIXED:
        raise click.UsageError("--cluster is one resource: use --resource-pattern-type literal with it")
    entries = []
    for permission, principals in ((Permission.ALLOW, allow), (Permission.DENY, deny)):
        for principal in principals:
            for resource, name in resources:
                for operation in operations:
                    try:
                        entries.append(
                            AclEntry(principal, resource, name, Operation(operation.lower()), permission, kind)
                        )
                    except ValueError as exc:
                        raise click.UsageError(str(exc)) from None
    return entries


def run_on_etcd(etcd_endpoints: str, work: Callable[[Any], Awaitable[T]]) -> T:
    endpoints = [e.strip() for e in etcd_endpoints.split(",") if e.strip()]
    if not endpoints:
        raise click.UsageError(
            f"no etcd endpoints: pass --etcd-endpoints, set {ETCD_ENV}, or give the --data-dir of a running broker"
        )
    try:
        parsed = [parse_etcd_endpoint(e) for e in endpoints]
        etcd_target(parsed)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None

    async def run() -> T:
        client: Any = open_etcd(parsed, timeout=int(ETCD_TIMEOUT))
        try:
            async with asyncio.timeout(ETCD_TIMEOUT):
                await client.connect()
                return await work(client)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), ETCD_TIMEOUT)

    try:
        return asyncio.run(run())
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except Exception as exc:  # the etcd client's errors have no common base worth naming
        raise click.ClickException(f"cannot reach etcd at {','.join(endpoints)}: {exc!r}") from None


def _describe(entry: AclEntry) -> str:
    name = "cluster" if entry.resource is ResourceType.CLUSTER else f"{entry.resource} {entry.name!r}"
    prefix = " (prefix)" if entry.pattern is Pattern.PREFIXED else ""
    return f"{entry.permission} {entry.principal} {entry.operation} on {name}{prefix}"


@acl.command("add")
@_entry_options
@etcd_option
@namespace_option
def add(etcd_endpoints: str, namespace: str, **flags: Any) -> None:
    """Add ACL entries (every combination of the principals, operations and resources given)."""
    entries = _entries(**_flag_args(flags))
    keys = namespace_keys(namespace)

    async def work(client: Any) -> None:
        for entry in entries:
            await add_acl(client, keys, entry)

    run_on_etcd(etcd_endpoints, work)
    for entry in entries:
        click.echo(f"added: {_describe(entry)}")


@acl.command("remove")
@_entry_options
@etcd_option
@namespace_option
def remove(etcd_endpoints: str, namespace: str, **flags: Any) -> None:
    """Remove exactly the ACL entries these flags describe (as they were added)."""
    entries = _entries(**_flag_args(flags))
    keys = namespace_keys(namespace)
    removed = run_on_etcd(etcd_endpoints, lambda client: remove_acls(client, keys, entries))
    click.echo(f"removed {removed} of {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}")
    if removed < len(entries):
        click.echo("(the others did not exist: `tidelog acl list` shows what does)")


def _flag_args(flags: dict[str, Any]) -> dict[str, Any]:
    return {
        "allow": flags["allow_principal"],
        "deny": flags["deny_principal"],
        "operations": flags["operations"],
        "streams": flags["streams"],
        "groups": flags["groups"],
        "on_cluster": flags["on_cluster"],
        "pattern": flags["pattern"],
    }


@acl.command("list")
@click.option("--principal", help="Only entries naming this principal (or *).")
@etcd_option
@namespace_option
@output_option
def list_(etcd_endpoints: str, namespace: str, principal: str | None, output: str) -> None:
    """Every ACL entry, and any record that does not decode (it denies everyone but super users)."""
    keys = namespace_keys(namespace)
    entries, broken = run_on_etcd(etcd_endpoints, lambda client: list_acls(client, keys))
    if principal is not None:
        entries = [e for e in entries if e.principal in (principal, "*")]
    entries.sort(key=lambda e: (e.principal, e.resource, e.name, e.operation, e.permission))
    if output == "json":
        print_json({"entries": [_as_json(e) for e in entries], "undecodable": [k.decode() for k in broken]})
        return
    out = table("PRINCIPAL", "PERMISSION", "OPERATION", "RESOURCE", "NAME", "PATTERN")
    for e in entries:
        out.add_row(e.principal, e.permission, e.operation, e.resource, e.name, e.pattern)
    console().print(out)
    for key in broken:
        click.echo(f"undecodable record {key.decode()}: every principal but super users is denied until removed")


def _as_json(entry: AclEntry) -> dict[str, str]:
    return {
        "principal": entry.principal,
        "permission": entry.permission.value,
        "operation": entry.operation.value,
        "resource": entry.resource.value,
        "name": entry.name,
        "pattern": entry.pattern.value,
    }
