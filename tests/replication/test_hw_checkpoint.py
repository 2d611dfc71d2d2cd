"""The high-watermark checkpoint is derived state: a damaged one falls back to the log start, never fatal."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.storage.logutil import make_batch, open_log
from tidelog.replication.hw_checkpoint import checkpointed_hw, read_hw_checkpoint, write_hw_checkpoint
from tidelog.storage.checkpoint import HW_CHECKPOINT_FILE

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize(
    "damage",
    [b"", b"tidelog high-watermark 1\n1\n", b"\xff\x00 garbage", b"tidelog high-watermark 5\n1\n4\ncrc32c 00000000\n"],
    ids=["empty", "torn", "garbage", "version"],
)
async def test_a_damaged_checkpoint_falls_back_to_the_log_start(
    tmp_path: Path, damage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    log = open_log(tmp_path)
    for i in range(4):
        await log.append(make_batch(2, tag=str(i)), 1)
    await write_hw_checkpoint(tmp_path, 6)
    assert checkpointed_hw(log) == 6
    await log.close()
    (tmp_path / HW_CHECKPOINT_FILE).write_bytes(damage)
    log = open_log(tmp_path)  # a restart: the log opens, the HW starts from its start
    with caplog.at_level(logging.WARNING):
        assert checkpointed_hw(log) == read_hw_checkpoint(log) == log.start_offset == 0
    assert f"unreadable {tmp_path / HW_CHECKPOINT_FILE}" in caplog.text and "log start 0" in caplog.text
    await write_hw_checkpoint(tmp_path, 8)  # and the next checkpoint replaces it
    assert checkpointed_hw(log) == 8
    await log.close()
