"""The web view's tables, each a self-refreshing HTML fragment: brokers, partitions, consumer groups, activity.

Every fragment is a ``<section>`` whose ``hx-get`` names its own URL (``/fragments/<name>``): the page embeds them
when it is rendered (so the tables are there with JavaScript off), and htmx swaps each for a fresh copy every
:data:`REFRESH` (with JavaScript on). The tables read one broker's view: the metadata mirror for the topology
(every broker has all of it), the partitions this broker holds for offsets and follower lag (``-`` where it holds
none), the group mirror and the cursor cache for consumer groups.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from html import escape

from tidelog.broker.partitions.partition import Partition
from tidelog.metadata.records import PartitionRecord
from tidelog.ui.changes import RecentChanges
from tidelog.ui.view import BrokerView

__all__ = ["FRAGMENTS", "REFRESH", "activity", "brokers", "groups", "partitions"]

REFRESH = "2s"
"""How often htmx reloads each table."""


def _table(caption: str, headers: Sequence[str], rows: Iterable[Sequence[object]], empty: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(cell))}</td>" for cell in row) + "</tr>" for row in rows)
    if not body:
        body = f'<tr><td colspan="{len(headers)}" class="empty">{escape(empty)}</td></tr>'
    return f"<table><caption>{escape(caption)}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _section(name: str, inner: str) -> str:
    return (
        f'<section id="{name}" hx-get="/fragments/{name}" hx-trigger="every {REFRESH}" hx-swap="outerHTML">'
        f"{inner}</section>"
    )


def brokers(view: BrokerView) -> str:
    """One row per broker: registered ones, then any a partition still names that has gone."""
    snapshot = view.mirror.snapshot
    controller = view.election.controller_id
    led: dict[str, int] = {}
    held: dict[str, int] = {}
    for p in snapshot.partitions.values():
        led[p.leader] = led.get(p.leader, 0) + 1
        for r in p.replicas:
            held[r] = held.get(r, 0) + 1
    rows = []
    for broker_id in sorted(snapshot.brokers.keys() | held.keys()):
        record = snapshot.brokers.get(broker_id)
        health = "alive" if record is not None else "offline (not registered)"
        address = f"{record.host}:{record.wire_port}" if record is not None else "-"
        role = "controller" if broker_id == controller else ""
        me = " (this broker)" if broker_id == view.broker_id else ""
        rows.append((broker_id + me, address, role, health, led.get(broker_id, 0), held.get(broker_id, 0)))
    headers = ("Broker", "Wire address", "Role", "Health", "Partitions led", "Replicas")
    return _section("brokers", _table("Brokers", headers, rows, "no broker is registered"))


def _state(record: PartitionRecord, alive: set[str], min_isr: int | None) -> str:
    notes = []
    if record.leader not in alive:
        notes.append("OFFLINE")
    if min_isr is not None and len(record.isr) < min_isr:
        notes.append("under min ISR")
    elif min_isr is not None and len(record.isr) == min_isr and len(record.isr) < len(record.replicas):
        notes.append("at min ISR")
    if len(record.isr) < len(record.replicas):
        notes.append("under-replicated")
    if record.paused:
        notes.append("paused")
    if record.readonly:
        notes.append("read-only")
    if record.suspended:
        notes.append(f"suspended: {record.suspended}")
    return ", ".join(notes) or "ok"


def partitions(view: BrokerView) -> str:
    """One row per partition of every stream; offsets and lag where this broker holds a replica."""
    snapshot = view.mirror.snapshot
    alive = set(snapshot.brokers)
    rows = []
    for key in sorted(snapshot.partitions):
        record = snapshot.partitions[key]
        if key[0] not in snapshot.streams:
            continue
        replica = view.manager.local(*key) or view.manager.follower(*key)
        hw: object = "-"
        end: object = "-"
        lag: object = "-"
        min_isr = None
        if replica is not None:
            hw, end = replica.high_watermark, replica.log_end
        if isinstance(replica, Partition):
            min_isr = replica.min_isr
            lag = max((_behind(replica, f) for f in record.replicas if f != view.broker_id), default=0)
        rows.append(
            (
                key[0],
                key[1],
                record.leader or "-",
                ", ".join(record.replicas),
                ", ".join(record.isr),
                hw,
                end,
                lag,
                _state(record, alive, min_isr),
            )
        )
    headers = ("Stream", "Partition", "Leader", "Replicas", "ISR", "HW", "Log end", "Lag", "State")
    return _section("partitions", _table("Streams and partitions", headers, rows, "no stream yet"))


def _behind(partition: Partition, follower: str) -> int:
    state = partition.followers.state(follower)
    if state is None:
        return 0
    end = partition.log_end
    return max(0, end - state.log_end if state.log_end >= 0 else end)


def groups(view: BrokerView) -> str:
    """Consumer groups (coordinator, members), then committed offsets and lag this broker knows of."""
    group_rows = []
    if view.groups is not None:
        for group in sorted(view.groups.groups.values(), key=lambda g: g.id):
            group_rows.append((group.id, group.coordinator, group.epoch, len(group.members)))
    cursor_rows = []
    if view.cursors is not None:
        for group_id, stream, partition, offset in sorted(view.cursors.cached()):
            replica = view.manager.local(stream, partition) or view.manager.follower(stream, partition)
            lag: object = "-"
            if replica is not None:
                lag = max(0, replica.high_watermark - max(offset + 1, replica.log_start))
            cursor_rows.append((group_id, stream, partition, offset, lag))
    inner = _table("Consumer groups", ("Group", "Coordinator", "Epoch", "Members"), group_rows, "no consumer group")
    inner += _table(
        "Committed offsets (cursors held here)",
        ("Group", "Stream", "Partition", "Committed", "Lag"),
        cursor_rows,
        "no cursor held by this broker",
    )
    return _section("groups", inner)


def activity(changes: RecentChanges) -> str:
    """The newest metadata changes this broker saw, newest first."""
    rows = [
        (dt.datetime.fromtimestamp(c.at, dt.UTC).strftime("%H:%M:%S"), c.revision, c.subject, c.what)
        for c in changes.newest()
    ]
    headers = ("Time (UTC)", "Revision", "Subject", "Change")
    return _section("activity", _table("Recent activity", headers, rows, "no change since this broker started"))


FRAGMENTS: dict[str, Callable[[BrokerView, RecentChanges], str]] = {
    "brokers": lambda view, _changes: brokers(view),
    "partitions": lambda view, _changes: partitions(view),
    "groups": lambda view, _changes: groups(view),
    "activity": lambda _view, changes: activity(changes),
}
"""Every fragment by the name in its URL."""
