"""``tidelog subscribe``: print a stream's records from a start position until Ctrl-C or a stop position.

``--offset N`` starts exactly there or fails: an offset outside a partition's records (below its log start, or
past its log end) is an error naming the partition's bounds, never silently another offset. ``--offset`` at the
log end waits for the next record, as ``--latest`` does.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import sys
import time

import click
from click.core import ParameterSource

from tidelog.cli.common import async_command, bootstrap, brokers_option, stream_name
from tidelog.client import AtTimestamp, Consumer, ConsumerRecord, StartPosition
from tidelog.protocol.errors import OffsetOutOfRangeError

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w)")
_NS = {"ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9, "d": 86400 * 10**9, "w": 7 * 86400 * 10**9}
_LATEST_NS = 2**63 - 1
TIME_FORMS = "a duration ago (30s, 5m, 2h, 1d, 1h30m), an ISO-8601 time (UTC unless it says), or ns since the epoch"


def _parse_time(text: str, now_ns: int | None = None) -> int:
    """Nanoseconds since the epoch from a duration ago (``5m``, ``1h30m``), an integer (ns) or an ISO-8601 time
    (UTC unless it says otherwise)."""
    text = text.strip()
    if text.isdigit():
        if int(text) > _LATEST_NS:
            raise click.BadParameter(f"{text!r}: ns since the epoch are at most {_LATEST_NS}", param_hint="--since")
        return int(text)
    if text and _DURATION.sub("", text) == "":
        ago = sum(int(n) * _NS[unit] for n, unit in _DURATION.findall(text))
        return max((time.time_ns() if now_ns is None else now_ns) - ago, 0)
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected {TIME_FORMS}", param_hint="--since") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    ns = int(moment.timestamp() * 1_000_000_000)
    if not 0 <= ns <= _LATEST_NS:
        raise click.BadParameter(
            f"{text!r}: record times run from 1970 to 2262 (ns since the epoch in 64 bits)", param_hint="--since"
        )
    return ns


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
    headers = f" headers: {', '.join(f'{k}={_text(v)}' for k, v in record.headers)}" if record.headers else ""
    return f"[{record.partition}:{record.offset} {when}{key}{headers}] {_text(record.value)}"


@click.command("subscribe")
@click.argument("stream", callback=stream_name)
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
@click.option(
    "--offset",
    "start_offset",
    type=click.IntRange(0),
    default=None,
    help="Start at this offset: one outside a partition's records is an error (never another offset); the log "
    "end waits for the next record.",
)
@click.option(
    "--since",
    "start_time",
    metavar="WHEN",
    default=None,
    help=f"Start at the first record at or after WHEN: {TIME_FORMS}.",
)
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
    brokers: list[str],
) -> None:
    """Print records of STREAM; stop with Ctrl-C, --stop-offset, --stop-at-end or --max-messages."""
    ctx = click.get_current_context()
    given = [
        option
        for option, name, explicit in (
            (f"--{start}", "start", None),
            ("--offset", "start_offset", start_offset is not None),
            ("--since", "start_time", start_time is not None),
        )
        if (explicit if explicit is not None else ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE)
    ]
    if len(given) > 1:
        raise click.UsageError(
            f"{' and '.join(given)} are two start positions: give one of --earliest, --latest, --offset or --since"
        )
    position: StartPosition = "earliest" if start == "earliest" else "latest"
    if start_offset is not None:
        position = start_offset
    if start_time is not None:
        position = AtTimestamp(_parse_time(start_time))
    printed = 0
    out = sys.stdout
    try:
        async with Consumer(
            bootstrap(brokers),
            stream,
            partitions=list(partitions) or None,
            start=position,
            stop_at_end=stop_at_end,
            auto_offset_reset="error" if start_offset is not None else "earliest",
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
    except OffsetOutOfRangeError as exc:
        raise click.ClickException(
            f"{exc.message}: --offset must be from the log start to the log end (the end waits for the next "
            "record); or use --earliest or --latest"
        ) from None
    except KeyboardInterrupt:  # pragma: no cover - interactive
        pass
