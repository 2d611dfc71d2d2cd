"""``tidelog activity``: tail the activity stream ``__activity``, one line per metadata change.

Each record of ``__activity`` is one Liftbridge ``ActivityStreamEvent`` (:mod:`tidelog.metadata.activity`). The
controller publishes at least once, so an event may arrive twice (after a controller failover): the command drops
every event whose id is not above the highest shown, as any reader should. ``--output table`` (the default)
prints a row per event as it arrives; ``--output json`` prints one JSON object per line (JSON lines: the command
streams, so there is no single document to close).
"""

from __future__ import annotations

import datetime as dt
import json
import sys

import click

from tidelog.cli.common import OUTPUT_CHOICES, async_command, bootstrap, brokers_option, client_credentials, client_tls
from tidelog.client import Consumer, ConsumerRecord, StartPosition
from tidelog.metadata.activity import ACTIVITY_STREAM, describe, revision_of
from tidelog.protocol._gen import api_pb2 as pb
from tidelog.protocol.errors import UnknownStreamError

_COLUMNS = "{offset:>7}  {time:<23}  {id:>16}  {op:<20}  {subject:<24}  {detail}"
_HEADER = _COLUMNS.format(offset="OFFSET", time="TIME (UTC)", id="ID", op="OP", subject="STREAM/GROUP", detail="DETAIL")
_HEADER += "\n"


def _event(record: ConsumerRecord) -> pb.ActivityStreamEvent | None:
    event = pb.ActivityStreamEvent()
    try:
        event.ParseFromString(record.value or b"")
    except Exception:
        return None
    return event


def _line(record: ConsumerRecord, event: pb.ActivityStreamEvent, output: str) -> str:
    op, subject, detail = describe(event)
    if output == "json":
        return json.dumps(
            {
                "offset": record.offset,
                "timestamp": record.timestamp,
                "id": event.id,
                "revision": revision_of(event.id),
                "op": op,
                "subject": subject,
                "detail": detail,
            }
        )
    when = dt.datetime.fromtimestamp(record.timestamp / 1e9, dt.UTC).isoformat(timespec="milliseconds")[:23]
    return _COLUMNS.format(offset=record.offset, time=when, id=event.id, op=op, subject=subject, detail=detail)


@click.command("activity")
@click.option("--earliest", "start", flag_value="earliest", default=True, help="From the first event (the default).")
@click.option("--latest", "start", flag_value="latest", help="Only events published from now on.")
@click.option("--stop-at-end", is_flag=True, help="Stop once the events that exist now are printed.")
@click.option("--max-events", "-n", type=click.IntRange(1), default=None, help="Stop after this many events.")
@click.option(
    "--output",
    "-o",
    type=click.Choice(OUTPUT_CHOICES),
    default="table",
    show_default=True,
    help="A row per event for people, or one JSON object per line for scripts.",
)
@brokers_option
@async_command
async def activity(start: str, stop_at_end: bool, max_events: int | None, output: str, brokers: list[str]) -> None:
    """Tail the activity stream: stream creations, deletions, pauses, resumptions, read-only changes, group joins
    and leaves, in the order the cluster committed them. Stop with Ctrl-C, --stop-at-end or --max-events."""
    position: StartPosition = "earliest" if start == "earliest" else "latest"
    out = sys.stdout
    shown, newest = 0, -1
    try:
        async with Consumer(
            bootstrap(brokers),
            ACTIVITY_STREAM,
            ssl=client_tls(),
            credentials=client_credentials(),
            start=position,
            stop_at_end=stop_at_end,
        ) as consumer:
            if output == "table":
                out.write(_HEADER)
                out.flush()
            async for record in consumer:
                event = _event(record)
                if event is None or event.id <= newest:
                    continue  # not an event, or a copy of one shown (the controller publishes at least once)
                newest = event.id
                out.write(_line(record, event, output) + "\n")
                out.flush()
                shown += 1
                if max_events is not None and shown >= max_events:
                    break
    except UnknownStreamError:
        raise click.ClickException(
            f"the cluster has no {ACTIVITY_STREAM} stream: its brokers run with activity_stream_enabled = false, or "
            "the controller has not created it yet"
        ) from None
