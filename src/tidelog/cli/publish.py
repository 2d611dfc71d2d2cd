"""``tidelog publish``: send values given as arguments, or one per line of standard input.

By default through the wire protocol, acknowledged per ``--acks``. With ``--nats`` the values go out as plain NATS
messages (no Liftbridge envelope, no acknowledgement) on the stream's subject, or partition *i*'s
(``SUBJECT.i``), or ``--subject``: what any NATS publisher does, so trying tidelog needs no other tool. The
partition leader subscribed to that subject stores them.

A message above ``max_message_bytes`` (key, value and headers; the broker's default is 1 MiB) is refused before
it is sent, naming its line; the messages before it are published, none after it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator

import click
from click.core import ParameterSource
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from tidelog.cli.common import (
    async_command,
    bootstrap,
    brokers_option,
    client_credentials,
    client_tls,
    local_broker,
    parse_headers,
    stream_name,
)
from tidelog.client import Admin, Producer
from tidelog.client.accumulator import RecordMetadata
from tidelog.protocol.errors import MessageTooLargeError
from tidelog.protocol.messages import Acks

console = Console(stderr=True)
PROGRESS_FROM = 100  # show a progress bar from this many messages on
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024  # the broker's default max_message_bytes
NATS_URL_ENV = "NATS_URL"  # as the nats CLI reads it
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


def _default_nats_url() -> str:
    """``$NATS_URL``, else the NATS server of the broker running on ``--data-dir`` (``make run``), else 4222."""
    if os.environ.get(NATS_URL_ENV):
        return os.environ[NATS_URL_ENV]
    found = local_broker()
    return found.nats[0] if found is not None and found.nats else DEFAULT_NATS_URL


NATS_TIMEOUT = 10  # seconds (nats-py takes whole seconds)


def _values(values: tuple[str, ...]) -> Iterator[bytes]:
    if values:
        yield from (v.encode() for v in values)
    else:
        for line in sys.stdin.buffer:
            yield line.rstrip(b"\r\n")


def _which(values: tuple[str, ...], index: int) -> str:
    return f"value {index + 1}" if values else f"line {index + 1} of standard input"


@click.command("publish")
@click.argument("stream", callback=stream_name)
@click.argument("values", nargs=-1)
@click.option("--key", "-k", default=None, help="Key of every message (partitions by key; not with --nats).")
@click.option("--header", "-H", "headers", multiple=True, help="NAME=VALUE header (repeatable).")
@click.option("--partition", "-p", type=click.IntRange(0), default=None, help="Partition (default: by key).")
@click.option(
    "--acks",
    type=click.Choice(["all", "leader", "none"]),
    default="all",
    show_default=True,
    help="Wait until the ISR has each message (all), the leader has it (leader), or nothing (none: no offsets).",
)
@click.option(
    "--idempotent/--no-idempotent",
    default=True,
    show_default=True,
    help="Stamp batches so that retries never store a message twice (not with --acks none).",
)
@click.option("--producer-name", default=None, help="Named idempotent producer: fences older instances of it.")
@click.option(
    "--max-message-bytes",
    type=click.IntRange(1),
    default=DEFAULT_MAX_MESSAGE_BYTES,
    show_default=True,
    help="Refuse larger messages before sending: the broker's max_message_bytes, if it was raised.",
)
@click.option(
    "--nats",
    "via_nats",
    is_flag=True,
    help="Publish plain NATS messages (no envelope, not acknowledged) to the stream's subject, as any NATS "
    "client would; with --partition, to that partition's subject (SUBJECT.i for i > 0).",
)
@click.option("--subject", default=None, help="With --nats: publish to this NATS subject instead.")
@click.option(
    "--nats-url",
    default=lambda: _default_nats_url(),
    show_default=f"${NATS_URL_ENV}, else the NATS of the broker in <data-dir>/endpoints.json, else {DEFAULT_NATS_URL}",
    help="With --nats: the NATS server (a broker with embedded NATS: its NATS port, 4222 by default).",
)
@click.option("--quiet", "-q", is_flag=True, help="Print nothing but errors.")
@brokers_option
@async_command
async def publish(
    stream: str,
    values: tuple[str, ...],
    key: str | None,
    headers: tuple[str, ...],
    partition: int | None,
    acks: str,
    idempotent: bool,
    producer_name: str | None,
    max_message_bytes: int,
    via_nats: bool,
    subject: str | None,
    nats_url: str,
    quiet: bool,
    brokers: list[str],
) -> None:
    """Publish VALUES (or standard input, one message per line) to STREAM.

    Through the broker, acknowledged per --acks (the default), or with --nats as plain NATS messages.
    """
    hdrs = parse_headers(headers)
    if subject is not None and not via_nats:
        raise click.BadParameter("only applies with --nats (the broker routes by stream)", param_hint="--subject")
    if via_nats:
        if key is not None:
            raise click.BadParameter("a plain NATS message has no key; drop --nats to publish keys", param_hint="--key")
        ctx = click.get_current_context()
        for name in ("acks", "idempotent", "producer_name", "max_message_bytes"):
            if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE:
                option = "--" + name.replace("_", "-")
                raise click.BadParameter(
                    "does not apply with --nats: plain NATS messages are neither acknowledged nor checked by "
                    "tidelog before they are sent",
                    param_hint=option,
                )
        await _publish_nats(stream, values, hdrs, partition, subject, nats_url, brokers, quiet)
        return
    key_bytes = key.encode() if key is not None else None
    total = len(values) or None
    if producer_name is not None and (not idempotent or acks == "none"):
        raise click.BadParameter("needs idempotence, and --acks other than none", param_hint="--producer-name")
    futures: list[asyncio.Future[RecordMetadata]] = []
    refused: str | None = None
    async with Producer(
        bootstrap(brokers),
        ssl=client_tls(),
        credentials=client_credentials(),
        acks=Acks[acks.upper()],
        idempotent=idempotent,
        producer_name=producer_name,
        max_message_bytes=max_message_bytes,
    ) as producer:
        show = not quiet and (total is None or total >= PROGRESS_FROM) and console.is_terminal
        with Progress(
            SpinnerColumn(),
            TextColumn("publishing"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            disable=not show,
            transient=True,
        ) as progress:
            task = progress.add_task("publish", total=total)

            def done(_: object) -> None:
                progress.advance(task)

            for index, value in enumerate(_values(values)):
                try:
                    future = await producer.send(stream, value, key=key_bytes, headers=hdrs, partition=partition)
                except MessageTooLargeError:
                    size = len(value) + len(key_bytes or b"") + sum(len(n.encode()) + len(v) for n, v in hdrs)
                    limit = (
                        f"{max_message_bytes}, the broker's default; --max-message-bytes if the broker allows more"
                        if max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES
                        else f"{max_message_bytes}, from --max-message-bytes"
                    )
                    refused = (
                        f"{_which(values, index)} is {size} bytes (key, value and headers), above "
                        f"max_message_bytes ({limit})"
                    )
                    break
                future.add_done_callback(done)
                futures.append(future)
            await producer.flush()
            results = await asyncio.gather(*futures)
    if refused is not None:
        raise click.ClickException(f"{refused}; {len(results)} message(s) before it published, none after it")
    if not quiet:
        console.print(_summary(stream, results, acks), soft_wrap=True)


def _summary(stream: str, results: list[RecordMetadata], acks: str) -> str:
    if not results:
        return f"nothing published to {stream}: no values given and standard input was empty"
    parts = ", ".join(map(str, sorted({r.partition for r in results})))
    if acks == "none":  # the broker does not say where they landed
        count = "1 message" if len(results) == 1 else f"{len(results)} messages"
        return f"sent {count} to {stream} (partition(s) {parts}) without acknowledgement (--acks none)"
    if len(results) == 1:
        r = results[0]
        return f"published to {stream} partition {r.partition} at offset {r.offset}"
    return f"published {len(results)} messages to {stream} (partition(s) {parts})"


async def _publish_nats(
    stream: str,
    values: tuple[str, ...],
    headers: list[tuple[str, bytes]],
    partition: int | None,
    subject: str | None,
    nats_url: str,
    brokers: list[str],
    quiet: bool,
) -> None:
    import nats
    from nats.errors import NoServersError

    if subject is None:
        async with Admin(bootstrap(brokers), ssl=client_tls(), credentials=client_credentials()) as admin:
            info = await admin.describe_stream(stream)
        count = len(info.partitions)
        if partition is not None and partition >= count:
            raise click.BadParameter(
                f"{stream} has partitions 0-{count - 1}, not {partition}", param_hint="--partition"
            )
        subject = info.subject if not partition else f"{info.subject}.{partition}"

    async def quiet_errors(_: Exception) -> None:
        """nats-py prints each failed attempt's traceback unless given this; the one-line error below says it."""

    try:
        client = await nats.connect(
            nats_url,
            connect_timeout=NATS_TIMEOUT,
            max_reconnect_attempts=1,  # nats-py reads 0 as "no limit"
            reconnect_time_wait=0.1,
            allow_reconnect=False,
            error_cb=quiet_errors,
        )
    except (NoServersError, OSError) as exc:
        raise click.ClickException(
            f"cannot reach NATS at {nats_url} ({exc or type(exc).__name__}): pass --nats-url or set {NATS_URL_ENV}"
        ) from None
    sent = 0
    try:
        nats_headers = {name: value.decode(errors="replace") for name, value in headers} or None
        for value in _values(values):
            await client.publish(subject, value, headers=nats_headers)
            sent += 1
        await client.flush(timeout=NATS_TIMEOUT)
    finally:
        await client.close()
    if not quiet:
        if sent:
            console.print(
                f"sent {sent} plain NATS message(s) to subject {subject} at {nats_url} (not acknowledged)",
                soft_wrap=True,
            )
        else:
            console.print(
                f"nothing sent to subject {subject}: no values given and standard input was empty", soft_wrap=True
            )
