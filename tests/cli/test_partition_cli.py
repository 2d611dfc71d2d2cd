"""``tidelog partition reset-head`` as parsed, without a broker (the whole story runs in
``tests/broker/test_fail_to_safety.py``): registered, documented, and refusing bad input before any request."""

from __future__ import annotations

from click.testing import CliRunner

from tidelog.cli.main import cli
from tidelog.launch.ports import free_port


def test_reset_head_is_a_partition_command_that_says_what_it_does() -> None:
    result = CliRunner().invoke(cli, ["partition", "reset-head", "--help"])
    assert result.exit_code == 0, result.output
    assert "Confirm the head of suspended partition PARTITION of STREAM" in result.output
    for option in ("--offset", "--yes", "--brokers"):
        assert option in result.output


def test_bad_arguments_are_usage_errors() -> None:
    for args in (["s", "-1"], ["s", "0", "--offset", "-5"], ["s"]):
        result = CliRunner().invoke(cli, ["partition", "reset-head", *args])
        assert result.exit_code == 2, (args, result.output)


def test_no_broker_is_one_line_and_exit_1() -> None:
    address = f"127.0.0.1:{free_port()}"
    result = CliRunner().invoke(cli, ["partition", "reset-head", "s", "0", "--yes", "--brokers", address])
    assert result.exit_code == 1
    assert "Error:" in result.output and "Traceback" not in result.output


def test_skip_damaged_says_what_it_does_and_wants_both_bounds() -> None:
    result = CliRunner().invoke(cli, ["partition", "skip-damaged", "--help"])
    assert result.exit_code == 0, result.output
    assert "found damaged on disk" in result.output
    for option in ("--from", "--to", "--yes", "--brokers"):
        assert option in result.output
    for args in (["s", "0", "--from", "5"], ["s", "0", "--to", "5"], ["s", "0", "--from", "-1", "--to", "2"]):
        result = CliRunner().invoke(cli, ["partition", "skip-damaged", *args, "--brokers", "127.0.0.1:1"])
        assert result.exit_code == 2, (args, result.output)
