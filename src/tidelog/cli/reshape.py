"""``tidelog stream add-partitions``, ``tidelog stream alter`` and ``tidelog cluster rebalance``.

Each goes to any broker, which has the controller make the change (fenced etcd transactions) and answers once
it has applied it. A person gets a spinner while the cluster works and a table of what changed; ``-o json``
prints one JSON document for scripts. Refusals (shrinking a stream, a setting that cannot change at run time)
are one line naming what was wrong and what is allowed, with a non-zero exit.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

import click
import msgspec
from rich.console import Console

from tidelog.cli.common import async_command, bootstrap, brokers_option, client_tls, output_option, stream_name
from tidelog.cli.render import print_json, table
from tidelog.cli.streams import MAX_PARTITIONS, partitions_table
from tidelog.client import Admin

console = Console()
T = TypeVar("T")


async def _working(what: str, output: str, call: Awaitable[T]) -> T:
    """Await ``call`` under a spinner saying ``what`` (only for a person at a terminal)."""
    if output == "json" or not console.is_terminal:
        return await call
    with console.status(what):
        return await call


@click.command("add-partitions")
@click.argument("name", callback=stream_name)
@click.option(
    "--to",
    "partitions",
    type=click.IntRange(1, MAX_PARTITIONS),
    required=True,
    help="The partition count the stream should have (more than it has; the same count changes nothing).",
)
@output_option
@brokers_option
@async_command
async def add_partitions(name: str, partitions: int, output: str, brokers: list[str]) -> None:
    """Add partitions to stream NAME until it has --to of them.

    New partition i listens on SUBJECT.i (Liftbridge's rule), so every existing partition keeps its subject and
    its data. A stream never shrinks: asking for fewer partitions than it has is refused.
    """
    async with Admin(bootstrap(brokers), ssl=client_tls()) as admin:
        answer = await _working(f"adding partitions to {name}", output, admin.add_partitions(name, partitions))
        info = await admin.describe_stream(name)
    added = tuple(p for p in info.partitions if p.id >= answer.before)
    if output == "json":
        print_json({"stream": name, "before": answer.before, "after": answer.after, "added": added})
        return
    if answer.after == answer.before:
        console.print(f"stream [bold]{name}[/] already has {answer.after} partition(s); nothing changed")
        return
    console.print(f"stream [bold]{name}[/]: {answer.before} → {answer.after} partitions")
    console.print(partitions_table(msgspec.structs.replace(info, partitions=added)))
    subjects = ", ".join(f"{info.subject}.{p.id}" for p in added[:3]) + (", ..." if len(added) > 3 else "")
    console.print(f"new partitions listen on {subjects}")


def _setting(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    settings: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise click.BadParameter(
                f"{item!r}: give KEY=VALUE, e.g. retention_max_age_ms=3600000 (VALUE 'default' for the broker's)",
                ctx,
                param,
            )
        if key.strip() in settings:
            raise click.BadParameter(f"{key.strip()!r} is set twice", ctx, param)
        settings[key.strip()] = value.strip()
    return settings


@click.command("alter")
@click.argument("name", callback=stream_name)
@click.option(
    "--set",
    "settings",
    multiple=True,
    required=True,
    callback=_setting,
    metavar="KEY=VALUE",
    help="A setting to change (repeatable); VALUE 'default' takes the broker's default.",
)
@output_option
@brokers_option
@async_command
async def alter(name: str, settings: dict[str, str], output: str, brokers: list[str]) -> None:
    """Change settings of stream NAME while it runs; every broker applies them without a restart.

    Settings that change at run time: retention_max_bytes, retention_max_messages, retention_max_age_ms,
    cleaner_interval_ms, segment_max_bytes (grow only), segment_max_age_ms, compact_enabled,
    compact_max_goroutines, compact_min_lag_ms, auto_pause_time_ms, auto_pause_disable_if_subscribers, min_isr,
    optimistic_concurrency_control, unclean_leader_election, local_retention_ms, local_retention_bytes. The others
    (encryption, tiered, flush_policy, flush_interval_ms) are refused by name, and nothing changes.
    """
    async with Admin(bootstrap(brokers), ssl=client_tls()) as admin:
        answer = await _working(f"changing {name}", output, admin.alter_stream(name, settings))
    if output == "json":
        print_json({"stream": name, "changes": answer.changes})
        return
    if not answer.changes:
        console.print(f"stream [bold]{name}[/] already has these settings; nothing changed")
        return
    rows = table("setting", "before", "after")
    for change in answer.changes:
        rows.add_row(change.name, change.before or "(default)", change.after or "(default)")
    console.print(f"changed stream [bold]{name}[/]:")
    console.print(rows)


@click.command("rebalance")
@output_option
@brokers_option
@async_command
async def rebalance(output: str, brokers: list[str]) -> None:
    """Elect preferred leaders now: every partition whose preferred replica (its first) is alive and in the ISR
    is led by it again (the controller also does this every balance_interval)."""
    async with Admin(bootstrap(brokers), ssl=client_tls()) as admin:
        answer = await _working("electing preferred leaders", output, admin.elect_leaders())
    if output == "json":
        print_json({"moved": answer.moved, "not_preferred": answer.not_preferred})
        return
    rows = table("leaderships moved", "still not on their preferred replica", numeric=("leaderships moved",))
    rows.add_row(str(answer.moved), str(answer.not_preferred))
    console.print(rows)
    if answer.not_preferred:
        console.print("a preferred replica that is down or out of the ISR gets its leadership back once it catches up")
