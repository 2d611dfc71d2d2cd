"""Fixtures shared by the storage tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tidelog.storage.segment import Segment

from .logutil import SEGMENT_BASE


@pytest.fixture
def segment(tmp_path: Path) -> Iterator[Segment]:
    """An empty segment at offset 100 with an index entry every 300 bytes."""
    seg = Segment.create(tmp_path, SEGMENT_BASE, index_interval_bytes=300)
    yield seg
    seg.close()
