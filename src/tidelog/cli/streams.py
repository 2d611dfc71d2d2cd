"""``tidelog stream create|list|describe|delete|pause|resume|readonly``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from tidelog.cli.common import async_command, bootstrap, brokers_option
from tidelog.client import Admin

console = Console()

_SETTINGS = {
    "retention_max_bytes": "retention.max.bytes",
    "retention_max_messages": "retention.max.messages",
    "retention_max_age_ms": "retention.max.age.ms",
    "segment_max_bytes": "segment.max.bytes",
    "segment_max_age_ms": "segment.max.age.ms",
    "flush_policy": "flush.policy",
    "min_isr": "min.isr",
}


@click.group("stream")
def stream() -> None:
    """Create, inspect and change streams."""


@stream.command("create")
@click.argument("name")
@click.option("--subject", "-s", default=None, help="NATS subject the stream listens on (default: the name).")
@click.option("--partitions", "-p", type=click.IntRange(1), default=1, show_default=True)
@click.option("--replication-factor", "-r", type=int, default=1, show_default=True, help="-1: every broker.")
@click.option("--group", default="", help="NATS queue group the partition leaders subscribe with.")
@click.option("--retention-max-bytes", type=click.IntRange(0), default=None)
@click.option("--retention-max-messages", type=click.IntRange(0), default=None)
@click.option("--retention-max-age-ms", type=click.IntRange(0), default=None)
@click.option("--segment-max-bytes", type=click.IntRange(1024), default=None)
@click.option("--segment-max-age-ms", type=click.IntRange(1), default=None)
@click.option("--flush-policy", type=click.Choice(["always", "interval", "never"]), default=None)
@click.option("--min-isr", type=click.IntRange(1), default=None)
@click.option("--compact", is_flag=True, default=False, help="Keep only the newest record per key.")
@brokers_option
@async_command
async def create(
    name: str,
    subject: str | None,
    partitions: int,
    replication_factor: int,
    group: str,
    compact: bool,
    brokers: str,
    **settings: str | int | None,
) -> None:
    """Create stream NAME (succeeds if it exists with the same subject)."""
    config: dict[str, str | int | bool] = {_SETTINGS[k]: v for k, v in settings.items() if v is not None}
    if compact:
        config["compact.enabled"] = True
    async with Admin(bootstrap(brokers)) as admin:
        await admin.create_stream(
            name, subject, partitions=partitions, replication_factor=replication_factor, group=group, config=config
        )
    console.print(
        f"created stream [bold]{name}[/] on subject [bold]{subject or name}[/] with {partitions} partition(s)"
    )


@stream.command("list")
@click.option("--prefix", default="", help="Only streams whose name starts with this.")
@brokers_option
@async_command
async def list_(prefix: str, brokers: str) -> None:
    """List streams."""
    async with Admin(bootstrap(brokers)) as admin:
        streams = await admin.list_streams(prefix)
    table = Table("stream", "subject", "partitions", "replication factor")
    for s in streams:
        table.add_row(s.name, s.subject, str(s.partitions), str(s.replication_factor))
    console.print(table if streams else "no streams")


@stream.command("describe")
@click.argument("name")
@brokers_option
@async_command
async def describe(name: str, brokers: str) -> None:
    """Show a stream's partitions: leader, replicas, ISR and offsets."""
    async with Admin(bootstrap(brokers)) as admin:
        info = await admin.describe_stream(name)
    console.print(f"stream [bold]{info.name}[/] on subject [bold]{info.subject}[/]")
    table = Table("partition", "leader", "replicas", "isr", "log start", "high watermark", "log end", "state")
    for p in info.partitions:
        flags = (("suspended", bool(p.suspended)), ("paused", p.paused), ("read-only", p.readonly))
        state = ", ".join(s for s, on in flags if on) or "active"
        table.add_row(
            str(p.id),
            p.leader or "-",
            ",".join(p.replicas),
            ",".join(p.isr),
            str(p.log_start),
            str(p.high_watermark),
            str(p.log_end),
            state,
            style="bold red" if p.suspended else None,
        )
    console.print(table)
    for p in info.partitions:
        if p.suspended:
            console.print(f"[bold red]partition {p.id} suspended[/]: {p.suspended}", soft_wrap=True)
            console.print(f"after checking the replicas: tidelog partition reset-head {info.name} {p.id}")


@stream.command("delete")
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@brokers_option
@async_command
async def delete(name: str, yes: bool, brokers: str) -> None:
    """Delete stream NAME and all its data."""
    if not yes:
        click.confirm(f"Delete stream {name!r} and all its data?", abort=True)
    async with Admin(bootstrap(brokers)) as admin:
        await admin.delete_stream(name)
    console.print(f"deleted stream [bold]{name}[/]")


F = TypeVar("F", bound=Callable[..., Any])


def _partitions_option() -> Callable[[F], F]:
    return click.option(
        "--partition",
        "-p",
        "partitions",
        type=click.IntRange(0),
        multiple=True,
        help="A partition (repeatable; default: all).",
    )


@stream.command("pause")
@click.argument("name")
@_partitions_option()
@brokers_option
@async_command
async def pause(name: str, partitions: tuple[int, ...], brokers: str) -> None:
    """Pause partitions; a publish to a paused partition resumes it."""
    async with Admin(bootstrap(brokers)) as admin:
        await admin.set_stream_state(name, partitions, paused=True)
    console.print(f"paused {_which(name, partitions)}")


@stream.command("resume")
@click.argument("name")
@_partitions_option()
@brokers_option
@async_command
async def resume(name: str, partitions: tuple[int, ...], brokers: str) -> None:
    """Resume paused partitions."""
    async with Admin(bootstrap(brokers)) as admin:
        await admin.set_stream_state(name, partitions, paused=False)
    console.print(f"resumed {_which(name, partitions)}")


@stream.command("readonly")
@click.argument("name")
@_partitions_option()
@click.option("--off", is_flag=True, help="Make the partitions writable again.")
@brokers_option
@async_command
async def readonly(name: str, partitions: tuple[int, ...], off: bool, brokers: str) -> None:
    """Make partitions read-only (writes are refused) or, with --off, writable."""
    async with Admin(bootstrap(brokers)) as admin:
        await admin.set_stream_state(name, partitions, readonly=not off)
    console.print(f"{'writable' if off else 'read-only'}: {_which(name, partitions)}")


def _which(name: str, partitions: tuple[int, ...]) -> str:
    return f"{name} partition(s) {', '.join(map(str, partitions))}" if partitions else f"all partitions of {name}"
