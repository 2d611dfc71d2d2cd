"""``log_format = json``: every line ``tidelog serve`` writes is one JSON object with the documented fields."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from tidelog.cli.logs import JsonFormatter, set_log_context
from tidelog.local.serve_process import start_served_broker


def test_a_json_line_carries_time_level_logger_message_and_context() -> None:
    set_log_context(broker="b7")
    record = logging.LogRecord("tidelog.x", logging.WARNING, __file__, 1, "%s: lagging", ("orders/3",), None)
    record.__dict__.update(stream="orders", partition=3)
    line = json.loads(JsonFormatter().format(record))
    assert line["level"] == "warning" and line["logger"] == "tidelog.x"
    assert line["message"] == "orders/3: lagging"
    assert (line["broker"], line["stream"], line["partition"]) == ("b7", "orders", 3)
    assert line["time"].endswith("Z") and "T" in line["time"]


@pytest.mark.slow
async def test_a_broker_started_with_log_format_json_writes_only_json_lines(tmp_path: Path) -> None:
    served = await start_served_broker(tmp_path, log_format="json", id="j0")
    assert await served.stop() == 0
    lines = [line for line in (tmp_path / "serve.log").read_text().splitlines() if not line.startswith("=====")]
    assert lines  # (the lines of ===== are ManagedProcess's own: when it started the process)
    parsed = [json.loads(line) for line in lines]  # every line: a JSON object
    assert all({"time", "level", "logger", "message"} <= set(each) for each in parsed)
    assert all(each["broker"] == "j0" for each in parsed if each["logger"].startswith("tidelog"))
    assert any("HTTP (/metrics, /healthz, /readyz) on" in each["message"] for each in parsed)
