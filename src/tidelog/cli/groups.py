"""``tidelog group list|describe|reset-offsets|delete``: consumer groups as ``kafka-consumer-groups`` shows them.

A group exists in the cluster's metadata while it has members (the controller deletes its record when the last
one leaves, as Liftbridge does); its committed offsets are cursors of the group's id in ``__cursors`` and outlive
the members. So ``list`` shows the groups that have members, ``describe`` a group with members or committed
offsets (or both), and ``reset-offsets`` and ``delete`` act only on a group without members: offsets of a live
group are its members' to commit, and they would overwrite a reset at their next commit.

A committed offset is the next offset the group reads; ``end`` is the partition's high watermark (one past the
last record a consumer can read) and ``lag`` the records between them. Reset-offsets is in
:mod:`tidelog.cli.group_reset`.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from typing import Any

import click
from rich.console import Console

from tidelog.cli.common import (
    async_command,
    bootstrap,
    brokers_option,
    client_credentials,
    client_tls,
    output_option,
    wide_option,
)
from tidelog.cli.render import print_json, short_ids, table
from tidelog.client import Admin
from tidelog.metadata.group_records import check_id
from tidelog.protocol.errors import InvalidArgumentError, UnknownGroupError, UnknownStreamError
from tidelog.protocol.group_messages import DescribeGroupResponse
from tidelog.protocol.messages import StreamInfo

console = Console()


def group_id(ctx: click.Context | None, param: click.Parameter | None, value: str) -> str:
    """A group id argument, checked by the broker's rule (1 to 255 printable characters, no '/' or whitespace)."""
    try:
        check_id("group id", value)
    except InvalidArgumentError as exc:
        raise click.BadParameter(exc.message, ctx, param) from None
    return value


@click.group("group")
def group() -> None:
    """List, describe, reset and delete consumer groups and their committed offsets."""


@group.command("list")
@output_option
@wide_option
@brokers_option
@async_command
async def list_(output: str, wide: bool, brokers: list[str]) -> None:
    """List the consumer groups that have members: coordinator, epoch, member count."""
    async with Admin(bootstrap(brokers), ssl=client_tls(), credentials=client_credentials()) as admin:
        groups = await admin.list_groups()
    if output == "json":
        print_json(groups)
        return
    ids = short_ids((g.coordinator for g in groups), wide)
    rows = table("group", "coordinator", "epoch", "members", numeric=("epoch", "members"))
    for g in groups:
        rows.add_row(g.group_id, ids.get(g.coordinator, g.coordinator), str(g.epoch), str(g.members))
    console.print(rows if groups else "no consumer groups with members")


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition of a group's streams: who consumes it, where the group is, how far behind."""

    stream: str
    partition: int
    member: str | None  # the member it is assigned to; None when none is
    committed: int | None  # the next offset the group reads; None: nothing committed
    log_start: int | None  # None: the stream is gone (a committed offset outlived it)
    end: int | None  # the high watermark
    lag: int | None


@dataclass(frozen=True, slots=True)
class GroupView:
    """What ``describe`` shows: the group's record (None: no members) and its partitions."""

    group_id: str
    record: DescribeGroupResponse | None
    partitions: tuple[PartitionLag, ...]


async def stream_infos(admin: Admin, names: set[str]) -> dict[str, StreamInfo]:
    """Each named stream with its partitions' bounds; streams that no longer exist are left out."""

    async def one(name: str) -> StreamInfo | None:
        try:
            return await admin.describe_stream(name)
        except UnknownStreamError:
            return None

    found = await asyncio.gather(*(one(n) for n in sorted(names)))
    return {info.name: info for info in found if info is not None}


async def live_record(admin: Admin, group: str) -> DescribeGroupResponse | None:
    """The group's record; None when it has no members."""
    try:
        return await admin.describe_group(group)
    except UnknownGroupError:
        return None


async def view_group(admin: Admin, group: str) -> GroupView:
    """The group's members and, for every partition of the streams it consumes or has offsets for, the lag."""
    record, committed = await asyncio.gather(live_record(admin, group), admin.group_offsets(group))
    if record is None and not committed:
        raise UnknownGroupError(f"no such consumer group {group}: it has no members and no committed offsets")
    owners: dict[tuple[str, int], str] = {}
    names = {stream for stream, _ in committed}
    for member in record.members if record is not None else ():
        names.update(member.streams)
        for assigned in member.assignments:
            owners.update({(assigned.stream, p): member.consumer_id for p in assigned.partitions})
    infos = await stream_infos(admin, names)
    rows: list[PartitionLag] = []
    for name in sorted(names):
        info = infos.get(name)
        if info is None:  # deleted: only its committed offsets remain
            rows.extend(
                PartitionLag(s, p, owners.get((s, p)), offset, None, None, None)
                for (s, p), offset in committed.items()
                if s == name
            )
            continue
        for p in info.partitions:
            offset = committed.get((name, p.id))
            lag = None if offset is None or offset < 0 else max(0, p.high_watermark - offset)
            rows.append(PartitionLag(name, p.id, owners.get((name, p.id)), offset, p.log_start, p.high_watermark, lag))
    return GroupView(group, record, tuple(rows))


def _shown(value: int | None) -> str:
    return "-" if value is None else str(value)


@group.command("describe")
@click.argument("group_name", metavar="GROUP", callback=group_id)
@output_option
@wide_option
@brokers_option
@async_command
async def describe(group_name: str, output: str, wide: bool, brokers: list[str]) -> None:
    """Show GROUP's members and, per partition of its streams: the member consuming it, the committed offset,
    the log end and the lag."""
    async with Admin(bootstrap(brokers), ssl=client_tls(), credentials=client_credentials()) as admin:
        view = await view_group(admin, group_name)
    if output == "json":
        print_json(_as_json(view))
        return
    record = view.record
    if record is None:
        console.print(f"group [bold]{view.group_id}[/]: no members (committed offsets only)")
    else:
        coordinator = short_ids([record.coordinator], wide)[record.coordinator]
        console.print(
            f"group [bold]{view.group_id}[/]: coordinator {coordinator}, epoch {record.epoch}, "
            f"{len(record.members)} member(s)"
        )
        members = table("member", "streams", "partitions", numeric=("partitions",))
        for m in record.members:
            count = sum(len(a.partitions) for a in m.assignments)
            members.add_row(m.consumer_id, ", ".join(m.streams), str(count))
        console.print(members)
    columns = ("stream", "part", "member", "committed", *(("start",) if wide else ()), "end", "lag")
    rows = table(*columns, numeric=("part", "committed", "start", "end", "lag"))
    for r in view.partitions:
        rows.add_row(
            r.stream,
            str(r.partition),
            r.member or "-",
            _shown(r.committed),
            *((_shown(r.log_start),) if wide else ()),
            _shown(r.end),
            _shown(r.lag),
        )
    console.print(rows)
    console.print("committed: the next offset the group reads; end: the high watermark")


def _as_json(view: GroupView) -> dict[str, Any]:
    record = view.record
    return {
        "group_id": view.group_id,
        "coordinator": record.coordinator if record is not None else None,
        "epoch": record.epoch if record is not None else None,
        "members": list(record.members) if record is not None else [],
        "partitions": [asdict(r) for r in view.partitions],
    }


@group.command("delete")
@click.argument("group_name", metavar="GROUP", callback=group_id)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@brokers_option
@async_command
async def delete(group_name: str, yes: bool, brokers: list[str]) -> None:
    """Delete GROUP's committed offsets; refused while the group has members."""
    if not yes:
        click.confirm(f"Delete consumer group {group_name!r} and its committed offsets?", abort=True)
    async with Admin(bootstrap(brokers), ssl=client_tls(), credentials=client_credentials()) as admin:
        record = await live_record(admin, group_name)
        if record is not None:
            raise click.ClickException(refusal(group_name, record, "deleting it"))
        deleted = await admin.delete_group(group_name)
    console.print(f"deleted consumer group [bold]{group_name}[/]: {deleted} committed offset(s)")


def refusal(group: str, record: DescribeGroupResponse, doing: str) -> str:
    """The one line refusing to change a group that has members."""
    names = ", ".join(m.consumer_id for m in record.members[:3]) + (", ..." if len(record.members) > 3 else "")
    return (
        f"consumer group {group} has {len(record.members)} live member(s) ({names}): stop them before {doing} "
        "(a member that stops without leaving is removed after the consumer timeout)"
    )
