"""What every command says about itself: help without markup, --output on every listing, the generated CLI
reference current, ``serve -s`` refusing unknown settings, and the start times ``--since`` takes."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tidelog.cli.main import cli
from tidelog.cli.reference import commands, help_text, render
from tidelog.cli.serve import parse_settings
from tidelog.cli.subscribe import _parse_time

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
LISTINGS = (
    "tidelog stream list",
    "tidelog stream describe",
    "tidelog cluster status",
    "tidelog partition skip-damaged",
    "tidelog group list",
    "tidelog group describe",
    "tidelog group reset-offsets",
)
NOW = 1_800_000_000_000_000_000


def test_reference_is_current() -> None:
    assert DOC.read_text() == render(), "regenerate: python -m tidelog.cli.reference > docs/cli.md"


@pytest.mark.parametrize("path", [path for path, _ in commands()])
def test_help_has_no_markup(path: str) -> None:
    command = dict(commands())[path]
    text = help_text(path, command)
    assert "``" not in text and ":class:" not in text and ":func:" not in text, text


def test_every_command_is_in_the_reference() -> None:
    listed = {path for path, _ in commands()}
    assert {"tidelog serve", "tidelog publish", "tidelog subscribe", "tidelog stream create", *LISTINGS} <= listed


@pytest.mark.parametrize("path", LISTINGS)
def test_every_listing_takes_output_json(path: str) -> None:
    command = dict(commands())[path]
    output = next(p for p in command.params if p.name == "output")
    assert isinstance(output.type, click.Choice) and list(output.type.choices) == ["table", "json"]


def test_serve_help_points_to_the_configuration_reference() -> None:
    result = CliRunner().invoke(cli, ["serve", "--help"], terminal_width=120)
    assert result.exit_code == 0
    assert "docs/configuration.md" in result.output and "-s, --setting KEY=VALUE" in result.output


def test_serve_settings_are_checked_before_anything_starts() -> None:
    assert parse_settings(("max_message_bytes=4194304", "segment-max-bytes = 1048576")) == {
        "max_message_bytes": "4194304",
        "segment_max_bytes": "1048576",
    }
    with pytest.raises(
        click.BadParameter, match=r"unknown setting 'max_mesage_bytes' \(did you mean max_message_bytes"
    ):
        parse_settings(("max_mesage_bytes=1",))
    with pytest.raises(click.BadParameter, match="not KEY=VALUE"):
        parse_settings(("max_message_bytes",))
    result = CliRunner().invoke(cli, ["serve", "-s", "no_such_setting=1"])
    assert result.exit_code == 2 and "docs/configuration.md" in result.output


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", NOW - 30 * 10**9),
        ("5m", NOW - 300 * 10**9),
        ("2h", NOW - 7200 * 10**9),
        ("1d", NOW - 86400 * 10**9),
        ("1h30m", NOW - 5400 * 10**9),
        ("1700000000000000000", 1_700_000_000_000_000_000),
        ("2027-01-15T08:00:00", int(dt.datetime(2027, 1, 15, 8, tzinfo=dt.UTC).timestamp()) * 10**9),
        ("2027-01-15T08:00:00+01:00", int(dt.datetime(2027, 1, 15, 7, tzinfo=dt.UTC).timestamp()) * 10**9),
    ],
)
def test_since_takes_durations_iso_times_and_nanoseconds(text: str, expected: int) -> None:
    assert _parse_time(text, now_ns=NOW) == expected


def test_since_refuses_times_past_64_bit_nanoseconds() -> None:
    with pytest.raises(click.BadParameter, match="1970 to 2262"):
        _parse_time("2999-01-01", now_ns=NOW)
    with pytest.raises(click.BadParameter, match="at most"):
        _parse_time(str(2**63), now_ns=NOW)


@pytest.mark.parametrize("text", ["5x", "yesterday", "-5m", "m5", ""])
def test_since_refuses_anything_else_naming_what_it_takes(text: str) -> None:
    with pytest.raises(click.BadParameter, match=r"a duration ago \(30s, 5m, 2h, 1d"):
        _parse_time(text, now_ns=NOW)
