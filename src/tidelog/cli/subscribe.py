"""``tidelog subscribe``: print a stream's records from a start position until Ctrl-C or a stop position."""

from __future__ import annotations

import base64
import datetime as dt
import json
import sys

import click

from tidelog.cli.common import async_command, bootstrap, brokers_option
from tidelog.client import AtTimestamp, Consumer, ConsumerRecord, StartPosition


def _parse_time(text: str) -> int:
    """Nanoseconds since the epoch from an integer (ns) or an ISO-8601 time (UTC unless it says otherwise)."""
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither nanoseconds nor an ISO-8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1_000_000_000)


def _text(data: bytes | None) -> str:
    if data is None:
        return ""
    try:
        return data.decode()
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode()


def _format(record: ConsumerRecord, fmt: str) -> str:
    if fmt == "value":
        return _text(record.value)
    if fmt == "json":
        return json.dumps(
            {
                "stream": record.stream,
                "partition": record.partition,
                "offset": record.offset,
                "timestamp": record.timestamp,
                "key": _text(record.key),
                "value": _text(record.value),
                "headers": {k: _text(v) for k, v in record.headers},
            }
        )
    when = dt.datetime.fromtimestamp(record.timestamp / 1e9, dt.UTC).isoformat(timespec="milliseconds")
    key = f" key={_text(record.key)}" if record.key is not None else ""
    return f"[{record.partition}:{record.offset} {when}{key}] {_text(record.value)}"


@click.command("subscribe")
@click.argument("stream")
@click.option(
    "--partition",
    "-p",
    "partitions",
    type=click.IntRange(0),
    multiple=True,
    help="Partition to read (repeatable; default: all).",
)
@click.option("--earliest", "start", flag_value="earliest", help="Start at the oldest record.")
@click.option("--latest", "start", flag_value="latest", default=True, help="Only new records (the default).")
@click.option("--offset", "start_offset", type=click.IntRange(0), default=None, help="Start at this offset.")
@click.option("--since", "start_time", default=None, help="Start at a time: ns since the epoch or ISO-8601.")
@click.option("--stop-offset", type=click.IntRange(0), default=None, help="Stop after this offset.")
@click.option("--stop-at-end", is_flag=True, help="Stop once the records that exist now are printed.")
@click.option("--max-messages", "-n", type=click.IntRange(1), default=None, help="Stop after this many.")
@click.option("--format", "fmt", type=click.Choice(["text", "value", "json"]), default="text", show_default=True)
@brokers_option
@async_command
async def subscribe(
    stream: str,
    partitions: tuple[int, ...],
    start: str,
    start_offset: int | None,
    start_time: str | None,
    stop_offset: int | None,
    stop_at_end: bool,
    max_messages: int | None,
    fmt: str,
    brokers: str,
) -> None:
    """Print records of STREAM; stop with Ctrl-C, --stop-offset, --stop-at-end or --max-messages."""
    position: StartPosition = "earliest" if start == "earliest" else "latest"
    if start_offset is not None:
        position = start_offset
    if start_time is not None:
        position = AtTimestamp(_parse_time(start_time))
    printed = 0
    out = sys.stdout
    try:
        async with Consumer(
            bootstrap(brokers), stream, partitions=list(partitions) or None, start=position, stop_at_end=stop_at_end
        ) as consumer:
            async for record in consumer:
                if stop_offset is not None and record.offset > stop_offset:
                    if len(consumer.partitions) == 1:
                        break
                    continue
                out.write(_format(record, fmt) + "\n")
                printed += 1
                if max_messages is not None and printed >= max_messages:
                    break
                if stop_offset is not None and record.offset == stop_offset and len(consumer.partitions) == 1:
                    break
            out.flush()
    except KeyboardInterrupt:  # pragma: no cover - interactive
        pass
