"""``tidelog stream create|list|describe|delete|pause|resume|readonly|rotate-key``.

Creating a stream that exists succeeds only when it is the same stream (subject, partitions, replication factor,
group and settings): one that differs is refused naming what differs, so a script never believes it made a
stream of 5 partitions when 3 exist.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from tidelog.cli.common import (
    async_command,
    bootstrap,
    brokers_option,
    client_credentials,
    client_tls,
    output_option,
    stream_name,
    wide_option,
)
from tidelog.cli.render import id_list, print_json, short_ids, table
from tidelog.client import Admin
from tidelog.protocol.messages import PartitionInfo, StreamInfo

console = Console()
MAX_PARTITIONS = 10_000  # the broker's limit (tidelog.broker.streams)


class ReplicationFactor(click.ParamType[int]):
    """A replication factor: a positive count of replicas, or -1 for every broker."""

    name = "N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            factor = int(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a whole number: give 1 or more replicas, or -1 for every broker", param, ctx)
        if factor < 1 and factor != -1:
            self.fail(f"{factor} replicas: give 1 or more, or -1 for every broker", param, ctx)
        return factor


def _subject(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and (not value.strip() or any(c.isspace() for c in value)):
        raise click.BadParameter(f"{value!r}: a NATS subject is dot-separated tokens without whitespace", ctx, param)
    return value


_SETTINGS = {
    "retention_max_bytes": "retention.max.bytes",
    "retention_max_messages": "retention.max.messages",
    "retention_max_age_ms": "retention.max.age.ms",
    "segment_max_bytes": "segment.max.bytes",
    "segment_max_age_ms": "segment.max.age.ms",
    "flush_policy": "flush.policy",
    "min_isr": "min.isr",
    "compact_min_lag_ms": "compact.min.lag.ms",
    "local_retention_ms": "local.retention.ms",
    "local_retention_bytes": "local.retention.bytes",
}


@click.group("stream")
def stream() -> None:
    """Create, inspect and change streams."""


@stream.command("create")
@click.argument("name", callback=stream_name)
@click.option(
    "--subject",
    "-s",
    default=None,
    callback=_subject,
    help="NATS subject the stream listens on (default: the name); partition i > 0 listens on SUBJECT.i.",
)
@click.option(
    "--partitions", "-p", type=click.IntRange(1, MAX_PARTITIONS), default=1, show_default=True, help="Partitions."
)
@click.option(
    "--replication-factor", "-r", type=ReplicationFactor(), default=1, show_default=True, help="-1: every broker."
)
@click.option("--group", default="", help="NATS queue group the partition leaders subscribe with.")
@click.option(
    "--retention-max-bytes", type=click.IntRange(0), default=None, help="Per partition: drop the oldest beyond this."
)
@click.option(
    "--retention-max-messages", type=click.IntRange(0), default=None, help="Per partition: keep at most this many."
)
@click.option("--retention-max-age-ms", type=click.IntRange(0), default=None, help="Drop records older than this.")
@click.option("--segment-max-bytes", type=click.IntRange(1024), default=None, help="Roll segment files at this size.")
@click.option("--segment-max-age-ms", type=click.IntRange(1), default=None, help="Roll segment files at this age.")
@click.option(
    "--flush-policy",
    type=click.Choice(["always", "interval", "never"]),
    default=None,
    help="When appends are fsynced (docs/durability.md).",
)
@click.option("--min-isr", type=click.IntRange(1), default=None, help="In-sync replicas an acks=all write needs.")
@click.option("--compact", is_flag=True, default=False, help="Keep only the newest record per key.")
@click.option(
    "--compact-min-lag-ms", type=click.IntRange(0), default=None, help="Compaction never removes younger records."
)
@click.option(
    "--encryption/--no-encryption",
    default=None,
    help="Encrypt the stream at rest (default: the brokers' default_encryption).",
)
@click.option(
    "--tiered/--no-tiered",
    default=None,
    help="Offload sealed segments to the brokers' tiered store (default: yes when they have one, unless compacted).",
)
@click.option(
    "--local-retention-ms",
    type=click.IntRange(0),
    default=None,
    help="Tiered: keep offloaded segments on brokers' disks this long.",
)
@click.option(
    "--local-retention-bytes",
    type=click.IntRange(0),
    default=None,
    help="Tiered: keep this many bytes of offloaded segments per partition on brokers' disks.",
)
@brokers_option
@async_command
async def create(
    name: str,
    subject: str | None,
    partitions: int,
    replication_factor: int,
    group: str,
    compact: bool,
    encryption: bool | None,
    tiered: bool | None,
    brokers: list[str],
    **settings: str | int | None,
) -> None:
    """Create stream NAME.

    Settings left out take the broker's defaults (docs/configuration.md). If NAME exists with the same settings
    this succeeds and changes nothing; with other settings (subject, partitions, replication factor, ...) it
    fails naming what differs.
    """
    config: dict[str, str | int | bool] = {_SETTINGS[k]: v for k, v in settings.items() if v is not None}
    if compact:
        config["compact.enabled"] = True
    if encryption is not None:
        config["encryption"] = encryption
    if tiered is not None:
        config["tiered"] = tiered
    async with Admin(bootstrap(brokers), ssl=client_tls(), credentials=client_credentials()) as admin:
        existed = any(s.name == name for s in await admin.list_streams(name))
        await admin.create_stream(
            name, subject, partitions=partitions, replication_factor=replication_factor, group=group, config=config
        )
    if existed:
        console.print(f"stream [bold]{name}[/] already exists with these settings; nothing changed")
    else:
        console.print(
            f"created stream [bold]{name}[/] on subject [bold]{subject or name}[/] with {partitions} partition(s)"
        )


@stream.command("list")
@click.option("--prefix", default="", help="Only streams whose name starts with this.")
@output_option
@brokers_option
@async_command
async def list_(prefix: str, output: str, brokers: list[str]) -> None:
    """List streams."""
    async with Admin(bootstrap(brokers), ssl=client_tls(), credentials=client_credentials()) as admin:
        streams = await admin.list_streams(prefix)
    if output == "json":
        print_json(streams)
        return
    rows = table("stream", "subject", "partitions", "replicas", numeric=("partitions", "replicas"))
    for s in streams:
        rows.add_row(s.name, s.subject, str(s.partitions), str(s.replication_factor))
    console.print(rows if streams else "no streams")


@stream.command("describe")
@click.argument("name", callback=stream_name)
@output_option
@wide_option
@brokers_option
@async_command
async def describe(name: str, output: str, wide: bool, brokers: list[str]) -> None:
    """Show a stream's partitions: leader, replicas, ISR, offsets (log start, high watermark, log end), state."""
    async with Admin(bootstrap(brokers), ssl=client_tls(), credentials=client_credentials()) as admin:
        info = await admin.describe_stream(name)
    if output == "json":
        print_json(info)
        return
    console.print(f"stream [bold]{info.name}[/] on subject [bold]{info.subject}[/]")
    console.print(partitions_table(info, wide))
    console.print("HW: high watermark (records below it are committed); end: the next offset")
    if tiered_table(info) is not None:
        console.print(tiered_table(info))
        console.print("remote: offsets in the tiered store; local: on the leader's disk (first..last, - for none)")
    for p in info.partitions:
        if p.suspended:
            console.print(f"[bold red]partition {p.id} suspended[/]: {p.suspended}", soft_wrap=True)
            console.print(f"after checking the replicas: tidelog partition reset-head {info.name} {p.id}")


def partitions_table(info: StreamInfo, wide: bool = False) -> Table:
    """A stream's partitions, one row each, in 80 columns: short broker ids and no log start column, unless
    ``wide``."""
    ids = short_ids((b for p in info.partitions for b in (*p.replicas, *p.isr, p.leader or "")), wide)
    columns = ("part", "leader", "replicas", "ISR", *(("start",) if wide else ()), "HW", "end", "state")
    rows = table(*columns, numeric=("part", "start", "HW", "end"))
    for p in info.partitions:
        flags = (("suspended", bool(p.suspended)), ("paused", p.paused), ("read-only", p.readonly))
        state = ", ".join(s for s, on in flags if on) or "active"
        rows.add_row(
            str(p.id),
            ids.get(p.leader, p.leader) if p.leader else "-",
            id_list(p.replicas, ids),
            id_list(p.isr, ids),
            *((str(p.log_start),) if wide else ()),
            str(p.high_watermark),
            str(p.log_end),
            state,
            style="bold red" if p.suspended else None,
        )
    return rows


def tiered_table(info: StreamInfo) -> Table | None:
    """Where each partition's offsets are, when some partition's leader reported offsets in the tiered store:
    a table of its own, so that the partitions table keeps to 80 columns. None for a stream with none there."""
    if not any(p.remote_start >= 0 for p in info.partitions):
        return None
    rows = table("part", "remote", "local", numeric=("part",))
    for p in info.partitions:
        rows.add_row(str(p.id), *_ranges(p))
    return rows


def _ranges(p: PartitionInfo) -> tuple[str, str]:
    """The partition's offsets in the tiered store and on its leader's disk, first..last ("-": none)."""
    remote = f"{p.remote_start}..{p.remote_end - 1}" if 0 <= p.remote_start < p.remote_end else "-"
    local_start = p.local_log_start if p.local_log_start >= 0 else p.log_start
    local = f"{local_start}..{p.log_end - 1}" if local_start < p.log_end else "-"
    return remote, local


@stream.command("delete")
@click.argument("name", callback=stream_name)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@brokers_option
@async_command
async def delete(name: str, yes: bool, brokers: list[str]) -> None:
    """Delete stream NAME and all its data."""
    if not yes:
        click.confirm(f"Delete stream {name!r} and all its data?", abort=True)
    async with Admin(bootstrap(brokers), ssl=client_tls(), credentials=client_credentials()) as admin:
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
@click.argument("name", callback=stream_name)
@_partitions_option()
@brokers_option
@async_command
async def pause(name: str, partitions: tuple[int, ...], brokers: list[str]) -> None:
    """Pause partitions: their logs close on every replica and NATS messages on their subjects are not stored
    until a publish, a subscribe with resume, or `stream resume` resumes them."""
    async with Admin(bootstrap(brokers), ssl=client_tls(), credentials=client_credentials()) as admin:
        await admin.set_stream_state(name, partitions, paused=True)
    console.print(f"paused {_which(name, partitions)}")


@stream.command("resume")
@click.argument("name", callback=stream_name)
@_partitions_option()
@brokers_option
@async_command
async def resume(name: str, partitions: tuple[int, ...], brokers: list[str]) -> None:
    """Resume paused partitions: every replica opens them again, and their leader subscribes to NATS."""
    async with Admin(bootstrap(brokers), ssl=client_tls(), credentials=client_credentials()) as admin:
        await admin.set_stream_state(name, partitions, paused=False)
    console.print(f"resumed {_which(name, partitions)}")


@stream.command("readonly")
@click.argument("name", callback=stream_name)
@_partitions_option()
@click.option("--off", is_flag=True, help="Make the partitions writable again.")
@brokers_option
@async_command
async def readonly(name: str, partitions: tuple[int, ...], off: bool, brokers: list[str]) -> None:
    """Make partitions read-only (writes are refused) or, with --off, writable."""
    async with Admin(bootstrap(brokers), ssl=client_tls(), credentials=client_credentials()) as admin:
        await admin.set_stream_state(name, partitions, readonly=not off)
    console.print(f"{'writable' if off else 'read-only'}: {_which(name, partitions)}")


@stream.command("rotate-key")
@click.argument("name", callback=stream_name)
@brokers_option
@async_command
async def rotate_key(name: str, brokers: list[str]) -> None:
    """Give encrypted stream NAME's partitions a new data key: new data is encrypted with it, older data stays
    readable with the keys it was written with (docs/durability.md, "Encryption at rest")."""
    async with Admin(bootstrap(brokers), ssl=client_tls(), credentials=client_credentials()) as admin:
        await admin.rotate_key(name)
    console.print(f"new data key for every partition of [bold]{name}[/]")


def _which(name: str, partitions: tuple[int, ...]) -> str:
    return f"{name} partition(s) {', '.join(map(str, partitions))}" if partitions else f"all partitions of {name}"
