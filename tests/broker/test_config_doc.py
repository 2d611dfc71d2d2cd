"""The committed configuration reference matches the configuration the broker actually accepts."""

from __future__ import annotations

from pathlib import Path

from tidelog.broker.config import config_keys
from tidelog.broker.config_doc import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_reference_is_current() -> None:
    assert DOC.read_text() == render(), "regenerate: python -m tidelog.broker.config_doc > docs/configuration.md"


def test_every_key_is_documented_with_its_variable() -> None:
    text = DOC.read_text()
    for key in config_keys():
        assert f"`{key}`" in text and f"`TIDELOG_{key.upper()}`" in text
