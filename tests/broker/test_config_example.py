"""The committed example configuration file matches the configuration the broker actually accepts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tidelog.broker.config import BrokerConfig, config_keys, load_config
from tidelog.broker.config_example import render
from tidelog.local.serve_process import start_served_broker

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tidelog.toml"
_COMMENTED_SETTING = re.compile(r"^# ([a-z_]+ = .*)$", re.MULTILINE)


def uncommented(text: str) -> str:
    """The example file with every setting line made live (its comments stay comments)."""
    return _COMMENTED_SETTING.sub(r"\1", text)


def test_example_file_is_current() -> None:
    regenerate = "python -m tidelog.broker.config_example > examples/tidelog.toml"
    assert EXAMPLE.read_text() == render(), f"regenerate: {regenerate}"


def test_example_file_as_shipped_loads_to_the_defaults() -> None:
    assert load_config(EXAMPLE, env={}) == BrokerConfig()


def test_example_file_names_every_key_once_at_its_default(tmp_path: Path) -> None:
    live = uncommented(EXAMPLE.read_text())
    keys = [line.split(" = ")[0] for line in live.splitlines() if line and not line.startswith("#")]
    assert keys == list(config_keys())
    path = tmp_path / "tidelog.toml"
    path.write_text(live)
    assert load_config(path, env={}) == BrokerConfig()


@pytest.mark.slow
async def test_serve_accepts_the_example_file_with_every_setting_live(tmp_path: Path) -> None:
    path = tmp_path / "tidelog.toml"
    path.write_text(uncommented(EXAMPLE.read_text()))
    # The served broker's own ports and data directory (flags and TIDELOG_* variables) override the file's.
    served = await start_served_broker(tmp_path, "--config", str(path))
    assert await served.stop() == 0
