"""Which streams tier, and how much of them brokers keep on disk: the stream's settings over the broker's."""

from __future__ import annotations

from pathlib import Path

from tidelog.broker.config import BrokerConfig
from tidelog.broker.tiering import TierPolicy, tier_policy
from tidelog.metadata.records import StreamConfig, StreamRecord


def stream(**config: object) -> StreamRecord:
    return StreamRecord("s", "s", "", 1, 1, 1, StreamConfig(**config))  # type: ignore[arg-type]


def broker(**settings: object) -> BrokerConfig:
    return BrokerConfig(data_dir=Path("/nonexistent"), **settings)  # type: ignore[arg-type]


def test_no_store_no_tiering() -> None:
    assert tier_policy(broker(), stream()) is None
    assert tier_policy(broker(), stream(tiered=True)) is None  # refused at creation (StreamAdmin), never run


def test_streams_tier_by_default_unless_compacted_or_turned_off() -> None:
    tiered = broker(tiered_store="file:///tmp/store", local_retention_ms=60_000)
    assert tier_policy(tiered, stream()) == TierPolicy(60_000, None)
    assert tier_policy(tiered, stream(compact_enabled=True)) is None
    assert tier_policy(broker(tiered_store="file:///tmp/store", compact_enabled=True), stream()) is None
    assert tier_policy(tiered, stream(tiered=False)) is None


def test_a_streams_local_retention_wins_and_zero_means_no_limit() -> None:
    tiered = broker(tiered_store="file:///tmp/store", local_retention_ms=60_000, local_retention_bytes=1 << 20)
    assert tier_policy(tiered, stream(local_retention_ms=0, local_retention_bytes=4096)) == TierPolicy(None, 4096)
