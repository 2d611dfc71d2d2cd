"""Log reads: batches, sendfile ranges, offsets by timestamp (tidelog.storage.log_read)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from tidelog.protocol.records import (
    NewRecord,
    build_batch,
)
from tidelog.storage.errors import OffsetOutOfRangeError

from .logutil import BASE_TS, batch_offsets, make_batch, open_log, read_everything, stored


async def test_read_limits(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_max_bytes=10**6)
    batches = [make_batch(2, tag=str(i)) for i in range(10)]
    for data in batches:
        await log.append(data, 1)
    size = len(stored(batches[0], 0, 1))
    assert len(log.read(0, 1)) == size  # at least one whole batch
    assert len(log.read(0, 3 * size + 5)) == 3 * size
    assert batch_offsets(log.read(3, 10**6, max_offset=8)) == [(2, 3), (4, 5), (6, 7)]
    assert log.read(0, 10**6, max_offset=1) == b""  # the first batch ends at 1: not below the bound
    assert log.read(20, 100) == b""  # at the end: nothing yet
    with pytest.raises(OffsetOutOfRangeError):
        log.read(21, 100)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 100)
    await log.close()


async def test_reads_move_across_segments(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_max_bytes=1000)
    expected = []
    for i in range(40):
        expected.append(stored(make_batch(2, size=50, tag=str(i)), 2 * i, 1))
        await log.append(make_batch(2, size=50, tag=str(i)), 1)
    assert len(log.segments) > 5
    assert read_everything(log, chunk=1) == b"".join(expected)
    assert read_everything(log, chunk=10**6) == b"".join(expected)
    await log.close()


async def test_read_range_serves_the_same_bytes_through_sendfile(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_max_bytes=2000)
    for i in range(30):
        await log.append(make_batch(3, tag=str(i)), 2)
    await log.close()
    log = open_log(tmp_path, segment_max_bytes=2000)  # reopened: nothing verified yet
    offset, received = 0, b""
    left, right = socket.socketpair()
    with left, right:
        while True:
            file_range = log.read_range(offset, 500)
            if file_range is None:
                break
            with file_range:
                sent = os.sendfile(left.fileno(), file_range.fd, file_range.position, file_range.length)
                assert sent == file_range.length
            received += right.recv(file_range.length, socket.MSG_WAITALL)
            offset = file_range.next_offset
    assert received == read_everything(log)
    assert offset == log.end_offset == 90
    await log.close()


async def test_file_range_survives_deletion_of_its_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_max_bytes=1000)
    for i in range(30):
        await log.append(make_batch(2, size=50, tag=str(i)), 1)
    file_range = log.read_range(0, 10**6)
    assert file_range is not None
    expected = log.read(0, 10**6)
    await log.delete_segments_before(log.end_offset)
    assert os.pread(file_range.fd, file_range.length, file_range.position) == expected
    file_range.close()
    await log.close()


async def test_offset_for_timestamp(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_max_bytes=1000)
    for i in range(30):  # batch i: records at BASE_TS + 100 i + 0, 1
        records = [NewRecord(b"x" * 40, timestamp=BASE_TS + 100 * i + j) for j in range(2)]
        await log.append(build_batch(records, timestamp=0), 1)
    assert log.offset_for_timestamp(0) == 0
    assert log.offset_for_timestamp(BASE_TS + 1001) == 21  # second record of batch 10
    assert log.offset_for_timestamp(BASE_TS + 1002) == 22
    assert log.offset_for_timestamp(BASE_TS + 2901) == 59
    assert log.offset_for_timestamp(BASE_TS + 2902) is None
    await log.close()


async def test_offset_for_timestamp_after_reopen(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_max_bytes=1000)
    for i in range(30):
        await log.append(make_batch(2, size=40, timestamp=BASE_TS + 1000 * i), 1)
    await log.close()
    log = open_log(tmp_path, segment_max_bytes=1000)
    assert log.offset_for_timestamp(BASE_TS + 15_500) == 32
    assert log.offset_for_timestamp(BASE_TS + 29_000) == 58
    assert log.offset_for_timestamp(BASE_TS + 29_001) is None
    await log.close()
