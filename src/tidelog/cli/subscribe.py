"""``tidelog subscribe``: print a stream's records from a start position until Ctrl-C or a stop position.

``--offset N`` starts exactly there or fails: an offset outside a partition's records (below its log start, or
past its log end) is an error naming the partition's bounds, never silently another offset. ``--offset`` at the
log end waits for the next record, as ``--latest`` does.

``--group G`` consumes as a member of consumer group ``G`` (:class:`~tidelog.client.GroupConsumer`): the group's
coordinator assigns the partitions, each is read from the group's committed offset (``--earliest`` or
``--latest`` only where it has none), and positions are committed every ``--commit-interval`` and when the
command ends (``--max-messages``, SIGINT or SIGTERM), before it leaves the group. Start and stop positions
other than those are refused with it: the committed offsets are the start.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import sys
import time
from collections.abc import Callable
from typing import Literal

import click
from click.core import ParameterSource

from tidelog.cli.common import async_command, bootstrap, brokers_option, client_credentials, client_tls, stream_name
from tidelog.cli.signals import stop_on_signals
from tidelog.client import AtTimestamp, Consumer, ConsumerRecord, GroupConsumer, StartPosition, StreamPartition
from tidelog.protocol.errors import OffsetOutOfRangeError

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w)")
_NS = {"ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9, "d": 86400 * 10**9, "w": 7 * 86400 * 10**9}
_LATEST_NS = 2**63 - 1
GROUP_POLL_S = 0.5  # longest a group member waits for a record before looking at the signals again
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
@click.option(
    "--group",
    "-g",
    "group_id",
    metavar="GROUP",
    default=None,
    help="Consume as a member of this consumer group, from its committed offsets, committing as it goes.",
)
@click.option("--consumer-id", default=None, help="This member's id in --group (default: a new random id).")
@click.option(
    "--commit-interval",
    type=click.IntRange(1),
    default=5000,
    show_default=True,
    metavar="MS",
    help="With --group: commit the positions every MS milliseconds (and on exit).",
)
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
    group_id: str | None,
    consumer_id: str | None,
    commit_interval: int,
    brokers: list[str],
) -> None:
    """Print records of STREAM; stop with Ctrl-C, --stop-offset, --stop-at-end or --max-messages."""
    ctx = click.get_current_context()
    if group_id is None:
        for option, name in (("--consumer-id", "consumer_id"), ("--commit-interval", "commit_interval")):
            if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE:
                raise click.UsageError(f"{option} is for a group member: give --group too")
    else:
        for option, present in (
            ("--partition", bool(partitions)),
            ("--offset", start_offset is not None),
            ("--since", start_time is not None),
            ("--stop-offset", stop_offset is not None),
            ("--stop-at-end", stop_at_end),
        ):
            if present:
                raise click.UsageError(
                    f"{option} cannot be used with --group: the group assigns the partitions and its committed "
                    "offsets are the start (--earliest or --latest say where a partition without one starts)"
                )
        reset: Literal["earliest", "latest"] = "earliest" if start == "earliest" else "latest"
        await _consume_as_member(
            bootstrap(brokers), stream, group_id, consumer_id, reset, commit_interval, max_messages, fmt
        )
        return
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
            ssl=client_tls(),
            credentials=client_credentials(),
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


async def _consume_as_member(
    brokers: list[str],
    stream: str,
    group_id: str,
    consumer_id: str | None,
    reset: Literal["earliest", "latest"],
    commit_interval_ms: int,
    max_messages: int | None,
    fmt: str,
) -> None:
    """Print the records of the partitions the group gives this member until --max-messages or a signal; then
    commit and leave the group (closing the consumer does both)."""
    stop = stop_on_signals(lambda name: click.echo(f"{name}: committing and leaving group {group_id}", err=True))

    def announce(verb: str) -> Callable[[frozenset[StreamPartition]], None]:
        def said(partitions: frozenset[StreamPartition]) -> None:
            names = ", ".join(f"{tp.stream}/{tp.partition}" for tp in sorted(partitions))
            click.echo(f"group {group_id}: {verb} {names}", err=True)

        return said

    printed = 0
    out = sys.stdout
    async with GroupConsumer(
        brokers,
        stream,
        ssl=client_tls(),
        credentials=client_credentials(),
        group_id=group_id,
        consumer_id=consumer_id,
        auto_offset_reset=reset,
        auto_commit_interval_ms=commit_interval_ms,
        on_assigned=announce("assigned"),
        on_revoked=announce("revoked"),
    ) as consumer:
        while not stop.is_set() and (max_messages is None or printed < max_messages):
            record = await consumer.getone(timeout=GROUP_POLL_S)
            if record is None:
                continue
            out.write(_format(record, fmt) + "\n")
            out.flush()
            printed += 1
