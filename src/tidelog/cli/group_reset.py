"""``tidelog group reset-offsets``: move a consumer group's committed offsets, as ``kafka-consumer-groups
--reset-offsets`` does.

One of five targets, for every partition chosen: ``--to-earliest`` (the log start), ``--to-latest`` (the high
watermark: the group skips what is there), ``--to-offset N``, ``--to-datetime T`` (the first record at or after
T) or ``--shift-by N`` (from the committed offset, back when negative). Offsets are kept within the partition's
bounds (log start to high watermark), as Kafka does; the plan shows where each lands. ``--shift-by`` needs a
committed offset to shift from, and is refused naming the partitions that have none.

The partitions: those of ``--stream`` (repeatable), or only ``--partition`` of one stream; without ``--stream``,
every partition the group has a committed offset for (in streams that still exist). The plan is printed (a
table, or JSON) and then written as the group's cursors (acks ALL), unless ``--dry-run``. Refused while the
group has members: their next commit would overwrite the reset (Kafka refuses the same). A member joining during
the reset is not prevented.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import enum
from dataclasses import asdict, dataclass

import click

from tidelog.cli.common import async_command, bootstrap, brokers_option, client_credentials, client_tls, output_option
from tidelog.cli.groups import console, group_id, live_record, refusal, stream_infos
from tidelog.cli.render import print_json, table
from tidelog.client import Admin
from tidelog.protocol.messages import PartitionInfo

DATETIME_FORMS = "an ISO-8601 time such as 2026-11-26T15:00:00 (UTC unless it names a zone: +01:00 or Z)"


class Target(enum.Enum):
    EARLIEST = "--to-earliest"
    LATEST = "--to-latest"
    OFFSET = "--to-offset"
    DATETIME = "--to-datetime"
    SHIFT = "--shift-by"


@dataclass(frozen=True, slots=True)
class Reset:
    """One partition's line of the plan."""

    stream: str
    partition: int
    committed: int | None  # now; None: nothing committed
    new: int


def new_offset(target: Target, value: int, log_start: int, end: int, committed: int | None, at_time: int) -> int:
    """Where ``target`` puts a partition with these bounds (``end``: the high watermark), within them.
    ``value``: the offset, or the shift; ``at_time``: the offset found for ``--to-datetime``."""
    match target:
        case Target.EARLIEST:
            wanted = log_start
        case Target.LATEST:
            wanted = end
        case Target.OFFSET:
            wanted = value
        case Target.DATETIME:
            wanted = at_time
        case Target.SHIFT:
            assert committed is not None
            wanted = committed + value
    return min(max(wanted, log_start), end)


def parse_datetime(text: str) -> int:
    """Nanoseconds since the epoch of an ISO-8601 time; UTC when it names no zone."""
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected {DATETIME_FORMS}", param_hint="--to-datetime") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    if not dt.datetime(1970, 1, 1, tzinfo=dt.UTC) <= moment < dt.datetime(2262, 1, 1, tzinfo=dt.UTC):
        raise click.BadParameter(f"{text!r}: record times run from 1970 to 2262", param_hint="--to-datetime")
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1_000


def _stream_names(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    for name in value:
        if not name or any(c.isspace() for c in name):
            raise click.BadParameter(f"{name!r}: a stream name is not empty and has no whitespace", ctx, param)
    return value


def _target(
    to_earliest: bool, to_latest: bool, to_offset: int | None, to_datetime: str | None, shift_by: int | None
) -> tuple[Target, int]:
    """The one target given, and its value; a usage error naming the choice when none or several are."""
    given = [
        (Target.EARLIEST, 0) if to_earliest else None,
        (Target.LATEST, 0) if to_latest else None,
        (Target.OFFSET, to_offset) if to_offset is not None else None,
        (Target.DATETIME, parse_datetime(to_datetime)) if to_datetime is not None else None,
        (Target.SHIFT, shift_by) if shift_by is not None else None,
    ]
    chosen = [(t, v) for t, v in (g for g in given if g is not None) if v is not None]
    choice = ", ".join(t.value for t in Target)
    if not chosen:
        raise click.UsageError(f"say where to reset the offsets to: give one of {choice}")
    if len(chosen) > 1:
        named = " and ".join(t.value for t, _ in chosen)
        raise click.UsageError(f"{named} are two targets: give exactly one of {choice}")
    return chosen[0]


@click.command("reset-offsets")
@click.argument("group_name", metavar="GROUP", callback=group_id)
@click.option("--to-earliest", is_flag=True, help="To each partition's log start.")
@click.option("--to-latest", is_flag=True, help="To each partition's high watermark (skip what is there).")
@click.option("--to-offset", type=click.IntRange(0), default=None, metavar="N", help="To offset N.")
@click.option("--to-datetime", default=None, metavar="T", help=f"To the first record at or after T: {DATETIME_FORMS}.")
@click.option("--shift-by", type=int, default=None, metavar="N", help="N records from the committed offset (-N: back).")
@click.option(
    "--stream", "-s", "streams", metavar="STREAM", multiple=True, callback=_stream_names,
    help="A stream (repeatable; default: every stream the group has committed offsets for).",
)  # fmt: skip
@click.option(
    "--partition", "-p", "partitions", metavar="P", type=click.IntRange(0), multiple=True,
    help="A partition of the one --stream (repeatable; default: all).",
)  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Show the plan; write nothing.")
@output_option
@brokers_option
@async_command
async def reset_offsets(
    group_name: str,
    to_earliest: bool,
    to_latest: bool,
    to_offset: int | None,
    to_datetime: str | None,
    shift_by: int | None,
    streams: tuple[str, ...],
    partitions: tuple[int, ...],
    dry_run: bool,
    output: str,
    brokers: list[str],
) -> None:
    """Set GROUP's committed offsets (the next offset it reads) to one target; refused while GROUP has members.

    Offsets stay within each partition's log start and high watermark. Prints the plan, then writes it unless
    --dry-run."""
    target, value = _target(to_earliest, to_latest, to_offset, to_datetime, shift_by)
    if partitions and len(set(streams)) != 1:
        raise click.UsageError("--partition needs exactly one --stream: the stream the partitions belong to")
    async with Admin(bootstrap(brokers), ssl=client_tls(), credentials=client_credentials()) as admin:
        record = await live_record(admin, group_name)
        if record is not None:
            raise click.ClickException(refusal(group_name, record, "resetting its offsets"))
        plan = await _plan(admin, group_name, target, value, streams, partitions)
        if not dry_run:
            await asyncio.gather(*(admin.set_cursor(r.stream, r.partition, group_name, r.new) for r in plan))
    if output == "json":
        print_json({"group_id": group_name, "dry_run": dry_run, "offsets": [asdict(r) for r in plan]})
        return
    rows = table("stream", "part", "committed", "new", numeric=("part", "committed", "new"))
    for r in plan:
        rows.add_row(r.stream, str(r.partition), "-" if r.committed is None else str(r.committed), str(r.new))
    console.print(rows)
    if dry_run:
        console.print(f"dry run: {len(plan)} offset(s) of group [bold]{group_name}[/] would be set; nothing written")
    else:
        console.print(f"set {len(plan)} committed offset(s) of group [bold]{group_name}[/]")


async def _plan(
    admin: Admin, group: str, target: Target, value: int, streams: tuple[str, ...], partitions: tuple[int, ...]
) -> list[Reset]:
    committed = await admin.group_offsets(group)
    names = set(streams) or {s for s, _ in committed}
    if not names:
        raise click.ClickException(
            f"consumer group {group} has no committed offsets: name the streams to set with --stream"
        )
    infos = await stream_infos(admin, names)
    missing = sorted(names - infos.keys())
    if missing and streams:
        raise click.ClickException(f"no stream named {missing[0]!r}")
    chosen: list[tuple[str, PartitionInfo, int | None]] = []
    for name, info in sorted(infos.items()):
        ids = [p.id for p in info.partitions]
        for wanted in partitions:
            if wanted not in ids:
                raise click.ClickException(f"stream {name!r} has partitions 0..{len(ids) - 1}, not {wanted}")
        for p in info.partitions:
            if (partitions and p.id not in partitions) or (not streams and (name, p.id) not in committed):
                continue
            offset = committed.get((name, p.id))
            chosen.append((name, p, None if offset is None or offset < 0 else offset))
    if target is Target.SHIFT:
        lacking = [f"{n}/{p.id}" for n, p, c in chosen if c is None]
        if lacking:
            raise click.ClickException(
                f"--shift-by needs a committed offset to shift from; none for {', '.join(lacking[:5])}"
                f"{', ...' if len(lacking) > 5 else ''}: use another target for them"
            )
    at_times = [0] * len(chosen)
    if target is Target.DATETIME:
        at_times = list(await asyncio.gather(*(admin.offset_at(n, p.id, value) for n, p, _ in chosen)))
    return [
        Reset(n, p.id, c, new_offset(target, value, p.log_start, p.high_watermark, c, at))
        for (n, p, c), at in zip(chosen, at_times, strict=True)
    ]
