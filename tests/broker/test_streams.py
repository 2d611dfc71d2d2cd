"""Input validation of stream administration: NATS subject rules, stream names, per-stream overrides."""

from __future__ import annotations

import pytest

from tidelog.broker.streams import validate_config, validate_stream_name, validate_subject
from tidelog.metadata.records import StreamConfig
from tidelog.protocol.errors import InvalidArgumentError


@pytest.mark.parametrize("subject", ["a", "a.b.c", "a.*", "*", ">", "a.>", "a.*.c", "*.*", "a-b_c.9", "ünï.cödé"])
def test_valid_subjects(subject: str) -> None:
    validate_subject(subject)


@pytest.mark.parametrize(
    "subject", ["", " ", "a b", "a\tb", ".", "a.", ".a", "a..b", ">.a", "a.>.b", "a*", "a.b*", "*a", "a>", "a.>b"]
)
def test_invalid_subjects(subject: str) -> None:
    with pytest.raises(InvalidArgumentError):
        validate_subject(subject)


@pytest.mark.parametrize(
    ("subject", "partitions"), [("x" * 1024, 1), ("x" * 1022, 10), ("a.>", 1), ("a.*", 3), ("x" * 1019, 10_000)]
)
def test_subjects_whose_partition_subjects_fit(subject: str, partitions: int) -> None:
    validate_subject(subject, partitions)


@pytest.mark.parametrize(
    ("subject", "partitions", "what"),
    [
        ("x" * 1025, 1, "1025 bytes long"),
        ("x" * 1023, 2, "partition 1 would listen on"),
        ("x" * 1020, 10_000, "partition 9999 would listen on"),
        ("a.>", 2, "'>' before its last token"),
    ],
)
def test_subjects_whose_partition_subjects_do_not_fit(subject: str, partitions: int, what: str) -> None:
    with pytest.raises(InvalidArgumentError, match=what) as raised:
        validate_subject(subject, partitions)
    assert len(raised.value.message) < 400  # the subject is quoted in part, never whole


def test_the_name_is_quoted_in_part() -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        validate_stream_name("n" * 10_000)
    assert "10000 characters" in raised.value.message and len(raised.value.message) < 300


@pytest.mark.parametrize("name", ["a", "orders-2024.eu_west", "X" * 249])
def test_valid_stream_names(name: str) -> None:
    validate_stream_name(name)


@pytest.mark.parametrize("name", ["", "a/b", "a b", "a*", "a>", "X" * 250, "\u00e9"])
def test_invalid_stream_names(name: str) -> None:
    with pytest.raises(InvalidArgumentError):
        validate_stream_name(name)


def test_valid_overrides() -> None:
    validate_config(StreamConfig())
    validate_config(StreamConfig(retention_max_age_ms=0, segment_max_bytes=1024, flush_policy="interval"))
    validate_config(StreamConfig(compact_enabled=False, min_isr=1))


@pytest.mark.parametrize(
    "config",
    [
        StreamConfig(retention_max_bytes=-1),
        StreamConfig(segment_max_age_ms=-5),
        StreamConfig(segment_max_bytes=1023),
        StreamConfig(flush_policy="sometimes"),
    ],
)
def test_invalid_overrides(config: StreamConfig) -> None:
    with pytest.raises(InvalidArgumentError):
        validate_config(config)
