"""Writing byte parts at a file position."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidelog.storage.file_writes import pwritev_all


def test_pwritev_all_finishes_short_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.pwritev

    def at_most_seven(fd: int, buffers: list, position: int) -> int:  # type: ignore[type-arg]
        data = b"".join(bytes(b) for b in buffers)[:7]
        return real(fd, [data], position)

    monkeypatch.setattr(os, "pwritev", at_most_seven)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        pwritev_all(fd, [b"abc", memoryview(b"defghijklmnop"), b"", b"qrstuvwxyz"], 3)
        assert os.pread(fd, 100, 0) == b"\x00\x00\x00abcdefghijklmnopqrstuvwxyz"
    finally:
        os.close(fd)
