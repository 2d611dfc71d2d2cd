"""``tidelog partition reset-head``: confirm the head of a suspended partition (fail to safety);
``tidelog partition skip-damaged``: list the offsets a leader found damaged on disk, and confirm skipping them.

A leader that finds evidence of lost consistency — a replica holding offsets beyond its log end, or a log that
ends below what it knew committed — refuses appends with PARTITION_SUSPENDED until an operator has looked and
confirmed where the log's head is (:mod:`tidelog.broker.partitions.safety`). This is that confirmation. It shows what it
is about to confirm (the evidence, the leader's bounds) and asks first, unless ``--yes``.
"""

from __future__ import annotations

import click
from rich.console import Console

from tidelog.cli.common import (
    async_command,
    bootstrap,
    brokers_option,
    client_credentials,
    client_tls,
    output_option,
    stream_name,
)
from tidelog.cli.render import print_json, table
from tidelog.client import Admin
from tidelog.protocol.messages import PartitionInfo, SkipDamagedResponse

console = Console()


@click.group("partition")
def partition() -> None:
    """Repair partitions."""


@partition.command("reset-head")
@click.argument("stream", callback=stream_name)
@click.argument("partition_id", metavar="PARTITION", type=click.IntRange(0))
@click.option(
    "--offset",
    type=click.IntRange(0),
    default=None,
    help="The head to confirm (default: the leader's log end). At most the log end, at least the high "
    "watermark; the leader cuts its uncommitted records beyond it.",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@brokers_option
@async_command
async def reset_head(stream: str, partition_id: int, offset: int | None, yes: bool, brokers: list[str]) -> None:
    """Confirm the head of suspended partition PARTITION of STREAM: appends resume there.

    Diagnose first: the suspension names its evidence ('tidelog cluster status' and 'tidelog stream describe'
    show it), and records beyond the confirmed head that only some replica holds are given up for good.
    """
    async with Admin(bootstrap(brokers), ssl=client_tls(), credentials=client_credentials()) as admin:
        if not yes:
            info = await admin.describe_stream(stream)
            found = next((p for p in info.partitions if p.id == partition_id), None)
            if found is not None and found.suspended:
                _show(stream, found)
                head = found.log_end if offset is None else offset
                click.confirm(
                    f"Confirm offset {head} as the head of {stream}/{partition_id} and resume appends?", abort=True
                )
        result = await admin.reset_head(stream, partition_id, offset=offset)
    console.print(f"head confirmed: [bold]{stream}/{partition_id}[/] takes appends again from offset {result.head}")
    rows = table(
        "stream",
        "part",
        "leader",
        "epoch",
        "head",
        "end before",
        "HW",
        numeric=("part", "epoch", "head", "end before", "HW"),
    )
    rows.add_row(
        stream,
        str(partition_id),
        result.leader,
        str(result.leader_epoch),
        str(result.head),
        str(result.log_end),
        str(result.high_watermark),
    )
    console.print(rows)
    if result.head < result.log_end:
        console.print(f"cut {result.log_end - result.head} uncommitted record(s) from the leader's log")
    if result.cleared:
        console.print(f"cleared: {result.cleared}", soft_wrap=True)


@partition.command("skip-damaged")
@click.argument("stream", callback=stream_name)
@click.argument("partition_id", metavar="PARTITION", type=click.IntRange(0))
@click.option("--from", "first", type=click.IntRange(0), default=None, help="First offset of the range to skip.")
@click.option("--to", "last", type=click.IntRange(0), default=None, help="Last offset of the range (inclusive).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@output_option
@brokers_option
@async_command
async def skip_damaged(
    stream: str, partition_id: int, first: int | None, last: int | None, yes: bool, output: str, brokers: list[str]
) -> None:
    """List the offsets of PARTITION of STREAM that its leader found damaged on disk (bit rot); with --from and
    --to (a range exactly as listed), confirm skipping it: readers then pass over those offsets silently.

    Readers are told about an unconfirmed range (OFFSET_DAMAGED, gRPC DATA_LOSS) and may read on past it. Skipped
    offsets are given up for good on this broker: restore them from a replica or a backup first if you can.
    """
    if (first is None) != (last is None):
        raise click.UsageError("give both --from and --to, or neither (to list the damaged ranges)")
    async with Admin(bootstrap(brokers), ssl=client_tls(), credentials=client_credentials()) as admin:
        listed = await admin.skip_damaged(stream, partition_id)
        if first is None or last is None:
            _show_damage(stream, partition_id, listed, output)
            return
        if output == "json" and not yes:
            raise click.UsageError("--output json asks no questions: add --yes to skip the range")
        if not yes:
            _show_damage(stream, partition_id, listed, output)
            click.confirm(f"Skip offsets {first}..{last} of {stream}/{partition_id} for good?", abort=True)
        result = await admin.skip_damaged(stream, partition_id, first, last)
    if output == "table":
        console.print(
            f"offsets {first}..{last} of [bold]{stream}/{partition_id}[/] are skipped: readers pass over them"
        )
    _show_damage(stream, partition_id, result, output)


def _show_damage(stream: str, partition_id: int, listed: SkipDamagedResponse, output: str) -> None:
    if output == "json":
        print_json(listed)
        return
    console.print(
        f"{stream}/{partition_id}: the leader found {listed.found_total} damaged range(s) since it started and "
        f"restored {listed.repaired_total} from a replica"
    )
    if not listed.ranges:
        console.print(f"{stream}/{partition_id}: no damaged offsets known")
        return
    rows = table("damaged offsets", "state", "found")
    for span in listed.ranges:
        rows.add_row(f"{span.first}..{span.last}", "skipped" if span.confirmed else "NOT confirmed", span.reason)
    console.print(rows)


def _show(stream: str, found: PartitionInfo) -> None:
    console.print(f"[bold red]{stream}/{found.id} is suspended[/]: {found.suspended}", soft_wrap=True)
    console.print(
        f"leader {found.leader or '-'} (epoch {found.leader_epoch}): log {found.log_start}..{found.log_end}, "
        f"high watermark {found.high_watermark}"
    )
