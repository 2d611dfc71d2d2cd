"""LogConfig: sensible defaults, and every bad value refused with a message naming the field."""

from __future__ import annotations

import dataclasses

import pytest

from tidelog.storage.config import FlushPolicy, LogConfig


def test_defaults_are_valid_and_durable() -> None:
    config = LogConfig()
    assert config.flush_policy is FlushPolicy.ALWAYS
    assert config.segment_max_bytes == 128 * 1024 * 1024
    assert config.retention_max_bytes is None and config.retention_max_age_ms is None
    assert config.segment_max_age_ns == 7 * 24 * 3600 * 10**9


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        LogConfig().segment_max_bytes = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("segment_max_bytes", 10, "segment_max_bytes must be between 61"),
        ("segment_max_bytes", 2**32, "segment_max_bytes must be between"),
        ("segment_max_bytes", 1.5, "segment_max_bytes must be an integer"),
        ("segment_max_age_ms", 0, "segment_max_age_ms must be at least 1"),
        ("index_interval_bytes", 0, "index_interval_bytes"),
        ("flush_policy", "always", "flush_policy must be a FlushPolicy (ALWAYS, INTERVAL, NEVER)"),
        ("flush_interval_ms", 0, "flush_interval_ms must be at least 1"),
        ("max_batch_bytes", 12, "max_batch_bytes must be at least 61"),
        ("retention_max_bytes", -1, "retention_max_bytes must be at least 0"),
        ("retention_max_age_ms", "1d", "retention_max_age_ms must be an integer or None"),
        ("retention_max_messages", True, "retention_max_messages must be an integer or None"),
        ("compact", 1, "compact must be True or False"),
        ("delete_retention_ms", -5, "delete_retention_ms must be at least 0"),
    ],
)
def test_bad_values_name_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        LogConfig(**{field: value})  # type: ignore[arg-type]


def test_retention_limits_accept_none_and_zero() -> None:
    config = LogConfig(retention_max_bytes=0, retention_max_age_ms=None, retention_max_messages=10)
    assert config.retention_max_bytes == 0
