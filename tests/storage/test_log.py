"""Log: opening, closing, and one append read back whole (the facade, tidelog.storage.log)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.protocol.records import (
    check_batch,
)
from tidelog.storage.errors import LogClosedError
from tidelog.storage.log import Log

from .logutil import make_batch, open_log, small_config, stored


async def test_append_assigns_dense_offsets_and_reads_back_identical_bytes(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    first, second = make_batch(3, tag="a"), make_batch(5, tag="b")
    r1 = await log.append(first, leader_epoch=7)
    r2 = await log.append(second, leader_epoch=8)
    assert (r1.base_offset, r1.last_offset, r1.batches, r1.size) == (0, 2, 1, len(first))
    assert (r2.base_offset, r2.last_offset) == (3, 7)
    assert log.end_offset == 8 and log.start_offset == 0
    assert log.read(0, 10**6) == stored(first, 0, 7) + stored(second, 3, 8)
    header = check_batch(log.read(4, 1))
    assert (header.base_offset, header.leader_epoch) == (3, 8)
    await log.close()


async def test_closed_log_refuses_everything(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    await log.append(make_batch(1), 1)
    await log.close()
    await log.close()  # idempotent
    with pytest.raises(LogClosedError):
        await log.append(make_batch(1), 1)
    with pytest.raises(LogClosedError):
        log.read(0, 10)
    with pytest.raises(LogClosedError):
        await log.truncate_to(0)


async def test_open_async_and_context_manager(tmp_path: Path) -> None:
    async with await Log.open_async(tmp_path, small_config()) as log:
        await log.append(make_batch(2), 1)
    assert log.closed
    async with await Log.open_async(tmp_path, small_config()) as log:
        assert log.recovery.clean_shutdown and log.end_offset == 2
