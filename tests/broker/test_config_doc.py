"""The committed configuration reference and example file match the configuration the broker actually accepts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tidelog.broker.config import BrokerConfig, config_keys, load_config
from tidelog.broker.config_doc import render, render_toml
from tidelog.testing.serve_process import start_served_broker

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"
EXAMPLE = ROOT / "examples" / "tidelog.toml"
_COMMENTED_SETTING = re.compile(r"^# ([a-z_]+ = .*)$", re.MULTILINE)


def uncommented(text: str) -> str:
    """The example file with every setting line made live (its comments stay comments)."""
    return _COMMENTED_SETTING.sub(r"\1", text)


def test_reference_is_current() -> None:
    assert DOC.read_text() == render(), "regenerate: python -m tidelog.broker.config_doc > docs/configuration.md"


def test_every_key_is_documented_with_its_variable() -> None:
    text = DOC.read_text()
    for key in config_keys():
        assert f"`{key}`" in text and f"`TIDELOG_{key.upper()}`" in text


def test_example_file_is_current() -> None:
    assert EXAMPLE.read_text() == render_toml(), (
        "regenerate: python -m tidelog.broker.config_doc --toml > examples/tidelog.toml"
    )


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
