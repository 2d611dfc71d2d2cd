"""Where ``tidelog group reset-offsets`` puts each partition, and its input checks, without a broker (the command
against a real broker: ``test_groups_cli.py``)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from tidelog.cli.group_reset import Target, new_offset, parse_datetime
from tidelog.cli.main import cli


@pytest.mark.parametrize(
    ("target", "value", "committed", "at_time", "expected"),
    [
        (Target.EARLIEST, 0, 7, 0, 3),
        (Target.LATEST, 0, 7, 0, 10),
        (Target.OFFSET, 5, None, 0, 5),
        (Target.OFFSET, 50, None, 0, 10),  # past the end: the end
        (Target.OFFSET, 0, None, 0, 3),  # below the log start: the log start
        (Target.SHIFT, -2, 7, 0, 5),
        (Target.SHIFT, -20, 7, 0, 3),
        (Target.SHIFT, 20, 7, 0, 10),
        (Target.DATETIME, 0, None, 8, 8),
    ],
)
def test_each_target_lands_within_the_partition_bounds(
    target: Target, value: int, committed: int | None, at_time: int, expected: int
) -> None:
    assert new_offset(target, value, 3, 10, committed, at_time) == expected  # log start 3, high watermark 10


def test_times_are_iso_8601_and_utc_unless_they_say() -> None:
    assert parse_datetime("1970-01-01T00:00:01") == 1_000_000_000
    assert parse_datetime("1970-01-01T01:00:01+01:00") == 1_000_000_000
    assert parse_datetime("1970-01-01T00:00:01.5Z") == 1_500_000_000
    for bad in ("yesterday", "1969-12-31T23:59:59", "2300-01-01T00:00:00"):
        with pytest.raises(click.BadParameter):
            parse_datetime(bad)


def test_group_commands_are_registered_and_refuse_bad_ids_before_any_request() -> None:
    result = CliRunner().invoke(cli, ["group", "--help"])
    assert result.exit_code == 0
    for command in ("list", "describe", "reset-offsets", "delete"):
        assert command in result.output
    for args in (["describe", "a b"], ["delete", "a/b", "--yes"], ["reset-offsets", "", "--to-latest"]):
        result = CliRunner().invoke(cli, ["group", *args, "--brokers", "127.0.0.1:1"])
        assert result.exit_code == 2, (args, result.output)
