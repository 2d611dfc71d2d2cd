"""``tidelog append``: write records as one transactional append, with expectations and registers (issue 5).

Every record given — as arguments, in a file, or on standard input, one per line — goes into ONE append
(:class:`tidelog.client.Appender`): all of them land at one contiguous range of offsets, or none do. Input is
read as it is sent, so an append may be larger than memory. The outcome is printed as a small table; with no
records nothing is written and the table shows the partition's log end and registers, which makes
``tidelog append STREAM < /dev/null`` the way to read them.

A failed expectation — the log does not end at ``--expected-offset``, or the registers do not match
``--check-registers`` — exits with status 3 and names what the broker found (the log end, the registers), so a
script can tell "lost the race: re-read and decide again" from other failures (status 1) and bad usage (2).

Registers are written in a small text syntax (:func:`parse_labels`, :func:`parse_selector`) that needs no
quoting, since label names and values are drawn from ASCII letters, digits and ``-_+/.`` only.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import BinaryIO

import click
from rich.console import Console
from rich.table import Table

from tidelog.cli.common import async_command, bootstrap, brokers_option, client_credentials, client_tls, parse_headers
from tidelog.client import Appender, AppendOutcome, refusal_details
from tidelog.protocol.errors import IncorrectOffsetError, RegisterMismatchError
from tidelog.protocol.labels import EMPTY, Label, LabelSelector, LabelSet, RegisterError, encode_selector
from tidelog.protocol.records import NewRecord

console = Console()

EXPECTATION_FAILED = 3
"""Exit status when an expectation failed: nothing was written, and the message says what the broker found."""

LABELS_SYNTAX = (
    "LABELS is comma-separated NAME=VALUE, e.g. 'author=a,zone=eu'; NAME alone (or NAME=) is the empty value. "
    "SELECTOR is LABELS that must all match (an empty value matches any value of the name) plus excluded "
    "labels written !NAME=VALUE or NAME!=VALUE (!NAME excludes the name with any value), e.g. "
    "'author=a,!frozen'. Names are 2-64 and values 0-1024 characters of ASCII letters, digits and -_+/. "
    "Empty registers match any selector."
)


class ExpectationFailed(click.ClickException):
    """An expectation of the append failed; nothing was written."""

    exit_code = EXPECTATION_FAILED


# ------------------------------------------------------------------------------------------ label syntax


def parse_labels(text: str, option: str) -> LabelSet:
    """``'author=a,zone=eu'`` as a :class:`LabelSet`; ``''`` is the empty set. Bad input names ``option``."""
    include, exclude = _parse(text, option, allow_exclude=False)
    assert not exclude
    return include


def parse_selector(text: str, option: str) -> LabelSelector:
    """``'author=a,!zone=eu'`` (or ``zone!=eu``) as a :class:`LabelSelector`. Bad input names ``option``."""
    include, exclude = _parse(text, option, allow_exclude=True)
    return LabelSelector(include, exclude)


def _parse(text: str, option: str, *, allow_exclude: bool) -> tuple[LabelSet, LabelSet]:
    include: list[Label] = []
    exclude: list[Label] = []
    try:
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            name, _, value = item.partition("=")
            excluded = name.startswith("!") or name.endswith("!")
            if excluded and not allow_exclude:
                raise click.BadParameter(f"{item!r}: excluded labels belong in a selector", param_hint=option)
            if excluded:
                exclude.append(Label(name[1:] if name.startswith("!") else name[:-1], value))
            else:
                include.append(Label(name, value))
        labels = LabelSet(include), LabelSet(exclude)
        encode_selector(LabelSelector(*labels))  # the limits registers travel under, checked before connecting
        return labels
    except RegisterError as exc:
        raise click.BadParameter(f"{text!r}: {exc}", param_hint=option) from None


def show_labels(labels: LabelSet) -> str:
    """Labels in the syntax :func:`parse_labels` reads; ``(none)`` for the empty set."""
    return ",".join(str(label) for label in labels) or "(none)"


# ------------------------------------------------------------------------------------------------ input


def _lines(source: BinaryIO) -> Iterator[bytes]:
    for line in source:
        yield line.rstrip(b"\r\n")


def _records(
    values: Iterator[bytes], key: bytes | None, headers: list[tuple[str, bytes]]
) -> Iterator[bytes | NewRecord]:
    if key is None and not headers:
        yield from values
    else:
        for value in values:
            yield NewRecord(value, key=key, headers=headers)


# ---------------------------------------------------------------------------------------------- command


@click.command("append", epilog=LABELS_SYNTAX)
@click.argument("stream")
@click.argument("values", nargs=-1)
@click.option("--partition", "-p", type=click.IntRange(0), default=0, show_default=True)
@click.option(
    "--expected-offset",
    type=click.IntRange(0),
    default=None,
    help="Append only if the partition's log ends exactly at this offset (0: only to an empty partition).",
)
@click.option(
    "--check-registers",
    metavar="SELECTOR",
    default=None,
    help="Append only if the partition's registers match SELECTOR (see below).",
)
@click.option(
    "--union-registers",
    metavar="LABELS",
    default=None,
    help="Set these labels in the registers, replacing each name's values (only if records are appended).",
)
@click.option(
    "--subtract-registers",
    metavar="LABELS",
    default=None,
    help="Remove each name whose values are exactly these, before the union (only if records are appended).",
)
@click.option(
    "--file",
    "-f",
    "source",
    type=click.File("rb", lazy=True),
    default=None,
    help="Read the values from this file, one per line ('-': standard input).",
)
@click.option("--key", "-k", default=None, help="Key of every record.")
@click.option("--header", "-H", "headers", multiple=True, help="NAME=VALUE header on every record (repeatable).")
@brokers_option
@async_command
async def append(
    stream: str,
    values: tuple[str, ...],
    partition: int,
    expected_offset: int | None,
    check_registers: str | None,
    union_registers: str | None,
    subtract_registers: str | None,
    source: BinaryIO | None,
    key: str | None,
    headers: tuple[str, ...],
    brokers: list[str],
) -> None:
    """Append VALUES (or a file's or standard input's lines) to STREAM as ONE transactional append.

    All records land at one contiguous range of offsets, or none do. With no records nothing is written, and
    the table shows the partition's log end and registers. Exit status: 0 appended, 3 an expectation failed
    (nothing written; the message shows the log end or registers found), 1 other failures, 2 bad usage.
    """
    if values and source is not None:
        raise click.BadParameter("give values as arguments or --file, not both", param_hint="--file")
    selector = parse_selector(check_registers, "--check-registers") if check_registers is not None else None
    union = parse_labels(union_registers, "--union-registers") if union_registers is not None else EMPTY
    subtract = parse_labels(subtract_registers, "--subtract-registers") if subtract_registers is not None else EMPTY
    lines = iter([value.encode() for value in values]) if values else _lines(source or sys.stdin.buffer)
    records = _records(lines, key.encode() if key is not None else None, parse_headers(headers))
    async with Appender(bootstrap(brokers), ssl=client_tls(), credentials=client_credentials()) as appender:
        try:
            outcome = await appender.append(
                stream,
                partition,
                records,
                expected_offset=expected_offset,
                check_registers=selector,
                union_registers=union,
                subtract_registers=subtract,
            )
        except (IncorrectOffsetError, RegisterMismatchError) as refused:
            raise _expectation_failed(refused, f"{stream}/{partition}", expected_offset, check_registers) from None
    console.print(_outcome_table(stream, partition, outcome))


def _expectation_failed(
    refused: IncorrectOffsetError | RegisterMismatchError, where: str, expected: int | None, selector: str | None
) -> ExpectationFailed:
    details = refusal_details(refused)
    if details is None:  # not from an append's answer; the broker's message is all there is
        return ExpectationFailed(f"{where}: {refused.message}; nothing was written")
    if isinstance(refused, IncorrectOffsetError):
        return ExpectationFailed(
            f"{where} ends at offset {details.log_end}, not at the expected offset {expected}; nothing was written"
        )
    return ExpectationFailed(
        f"the registers of {where} are {show_labels(details.registers)}, which do not match "
        f"--check-registers {selector!r}; nothing was written (log end {details.log_end})"
    )


def _outcome_table(stream: str, partition: int, outcome: AppendOutcome) -> Table:
    count = outcome.last_offset - outcome.base_offset + 1 if outcome.base_offset >= 0 else 0
    table = Table(show_header=False, title="appended" if count else "nothing appended", title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    table.add_row("stream", f"{stream} partition {partition}")
    table.add_row("records", str(count))
    table.add_row("offsets", f"{outcome.base_offset}-{outcome.last_offset}" if count else "-")
    table.add_row("log end", str(outcome.log_end))
    table.add_row("registers", show_labels(outcome.registers))
    return table
