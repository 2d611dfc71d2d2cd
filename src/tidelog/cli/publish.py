"""``tidelog publish``: send values given as arguments, or one per line of standard input."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from tidelog.cli.common import async_command, bootstrap, brokers_option, parse_headers
from tidelog.client import Producer
from tidelog.protocol.messages import Acks

console = Console(stderr=True)
PROGRESS_FROM = 100  # show a progress bar from this many messages on


def _values(values: tuple[str, ...]) -> Iterator[bytes]:
    if values:
        yield from (v.encode() for v in values)
    else:
        for line in sys.stdin.buffer:
            yield line.rstrip(b"\r\n")


@click.command("publish")
@click.argument("stream")
@click.argument("values", nargs=-1)
@click.option("--key", "-k", default=None, help="Key of every message (partitions by key).")
@click.option("--header", "-H", "headers", multiple=True, help="NAME=VALUE header (repeatable).")
@click.option("--partition", "-p", type=click.IntRange(0), default=None, help="Partition (default: by key).")
@click.option("--acks", type=click.Choice(["all", "leader", "none"]), default="all", show_default=True)
@click.option(
    "--idempotent/--no-idempotent",
    default=True,
    show_default=True,
    help="Stamp batches so that retries never store a message twice (not with --acks none).",
)
@click.option("--producer-name", default=None, help="Named idempotent producer: fences older instances of it.")
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
    quiet: bool,
    brokers: str,
) -> None:
    """Publish VALUES (or standard input, one message per line) to STREAM."""
    hdrs = parse_headers(headers)
    key_bytes = key.encode() if key is not None else None
    total = len(values) or None
    if producer_name is not None and (not idempotent or acks == "none"):
        raise click.BadParameter("needs idempotence, and --acks other than none", param_hint="--producer-name")
    async with Producer(
        bootstrap(brokers), acks=Acks[acks.upper()], idempotent=idempotent, producer_name=producer_name
    ) as producer:
        futures = []
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

            for value in _values(values):
                future = await producer.send(stream, value, key=key_bytes, headers=hdrs, partition=partition)
                future.add_done_callback(done)
                futures.append(future)
            await producer.flush()
            results = await asyncio.gather(*futures)
    if not quiet:
        if len(results) == 1:
            r = results[0]
            console.print(f"published to {stream} partition {r.partition} at offset {r.offset}")
        else:
            parts = sorted({r.partition for r in results})
            console.print(f"published {len(results)} messages to {stream} (partitions {', '.join(map(str, parts))})")
