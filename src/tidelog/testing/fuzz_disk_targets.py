"""Fuzz targets for the bytes tidelog reads back from its own disk: checkpoint files and segment recovery.

Files on disk are untrusted too: a bit flip, a torn or rolled-back write, a file copied from elsewhere. The
readers must refuse them with their typed error (:class:`~tidelog.storage.errors.CheckpointError`,
:class:`~tidelog.storage.errors.StorageError`) or recover, never crash or allocate what a damaged length claims.

Both targets write the fuzzed bytes into files of a scratch directory (under ``/dev/shm`` when it exists: an
fsync there costs nothing) and run the real reader on them, so the file-reading code is covered with the parsing.
The input's first bytes choose the file layout; the contract is in :mod:`tidelog.testing.fuzz_contract`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import struct
import tempfile
from pathlib import Path

from tidelog.protocol.records import NewRecord, build_batch
from tidelog.protocol.records.errors import RecordFormatError
from tidelog.replication.idempotence.producer_snapshot import read_snapshot
from tidelog.storage.checkpoint import HighWatermarkCheckpoint, encode_checkpoint
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.damage import DAMAGE_FILE, DamageRegistry
from tidelog.storage.epoch_cache import LeaderEpochCache
from tidelog.storage.errors import CheckpointError, StorageError
from tidelog.storage.log import Log
from tidelog.storage.recovery import MARKER_FILE, RECOVERY_POINT_FILE, recover
from tidelog.storage.segment_install import verify_staged
from tidelog.storage.segment_state import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, segment_name
from tidelog.testing.fuzz_contract import Target

INDEX_INTERVAL_BYTES = 256
_U16 = struct.Struct(">H")

_scratch: tempfile.TemporaryDirectory[str] | None = None


def scratch_directory() -> Path:
    """An empty directory for this process's decodes (made once, emptied before each use, removed at exit).

    ``TIDELOG_FUZZ_SCRATCH`` names a fixed one instead, kept at exit: libFuzzer ends the process without running
    Python's exit handlers, so the atheris scripts reuse one directory per target rather than leak one per run.
    """
    global _scratch
    fixed = os.environ.get("TIDELOG_FUZZ_SCRATCH")
    if fixed:
        root = Path(fixed)
    else:
        if _scratch is None:
            _scratch = tempfile.TemporaryDirectory(
                prefix="tidelog-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
            )
        root = Path(_scratch.name)
    path = root / "p"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


# ------------------------------------------------------------------------------------------------- checkpoints

_CHECKPOINT_KINDS = ("high-watermark", "leader-epoch", "producer-state", DAMAGE_FILE)


def decode_checkpoints(data: bytes) -> None:
    """The first byte picks the file (HW checkpoint, leader-epoch checkpoint, producer snapshot, damaged-ranges
    registry); the rest is its content. The registry is advisory: a damaged one is logged and read as empty."""
    if not data:
        return
    kind = _CHECKPOINT_KINDS[data[0] % len(_CHECKPOINT_KINDS)]
    directory = scratch_directory()
    path = directory / kind
    path.write_bytes(data[1:])
    if kind == "high-watermark":
        HighWatermarkCheckpoint(path).read()
    elif kind == "leader-epoch":
        LeaderEpochCache(path)
    elif kind == "producer-state":
        read_snapshot(path)
    else:
        DamageRegistry.load(directory)


def _checkpoint_seeds() -> list[bytes]:
    hw = encode_checkpoint("high-watermark", 1, [(4096,)])
    epochs = encode_checkpoint("leader-epoch", 2, [(0, 0), (3, 120), (7, 4000)])
    snapshot = encode_checkpoint(
        "producer-state",
        8,
        [(0, 50, 0, 0, 0, 0, 0, 0), (1, 9, 2, 1, 0, 0, 0, 0), (2, 9, 2, 0, 4, 10, 14, 99), (3, 11, 1, 77, 0, 0, 0, 0)],
    )
    many = encode_checkpoint("leader-epoch", 2, [(i, i * 10) for i in range(200)])
    damage = b'{"version": 1, "ranges": [{"first": 3, "last": 9, "reason": "CRC mismatch", "where": "seg"}]}'
    return [
        b"\x00" + hw,
        b"\x01" + epochs,
        b"\x02" + snapshot,
        b"\x03" + damage,
        b"\x01" + many,
        b"\x00" + hw[:-5],
        b"\x00",
    ]


# ------------------------------------------------------------------------------------------------- segment recovery

FLAG_CLEAN = 0x01  # write a clean-shutdown marker naming the (first) segment's size: its indexes are trusted
FLAG_RECOVERY_POINT = 0x02  # write a recovery point past everything: earlier segments are trusted
FLAG_TRUNCATE = 0x04  # open with truncate_damaged (a replica that will re-fetch)
FLAG_TWO_SEGMENTS = 0x08  # a second segment follows the first


def _take(data: bytes, pos: int) -> tuple[bytes, int]:
    """A u16-length-prefixed field at ``pos`` (shorter when the data ends first)."""
    (length,) = _U16.unpack_from(data.ljust(pos + 2, b"\x00"), pos)
    return data[pos + 2 : pos + 2 + length], pos + 2 + length


def decode_segment_recovery(data: bytes) -> None:
    """Lay out a partition directory from ``data`` and open it the way a restarting broker does.

    Layout: flags (1 byte), the first segment's offset index, time index and log (each u16-length-prefixed),
    then with ``FLAG_TWO_SEGMENTS`` the second segment's base offset (u16) and its log (the rest).
    """
    if not data:
        return
    flags = data[0]
    index, pos = _take(data, 1)
    timeindex, pos = _take(data, pos)
    log, pos = _take(data, pos)
    directory = scratch_directory()
    first = segment_name(0)
    (directory / (first + LOG_SUFFIX)).write_bytes(log)
    (directory / (first + INDEX_SUFFIX)).write_bytes(index)
    (directory / (first + TIMEINDEX_SUFFIX)).write_bytes(timeindex)
    if flags & FLAG_TWO_SEGMENTS:
        (base,) = _U16.unpack_from(data.ljust(pos + 2, b"\x00"), pos)
        (directory / (segment_name(max(1, base)) + LOG_SUFFIX)).write_bytes(data[pos + 2 :])
    if flags & FLAG_CLEAN:
        (directory / MARKER_FILE).write_bytes(encode_checkpoint(MARKER_FILE, 2, [(0, len(log))]))
    if flags & FLAG_RECOVERY_POINT:
        (directory / RECOVERY_POINT_FILE).write_bytes(encode_checkpoint(RECOVERY_POINT_FILE, 1, [(1 << 40,)]))
    segments, _ = recover(directory, INDEX_INTERVAL_BYTES, truncate_damaged=bool(flags & FLAG_TRUNCATE))
    for segment in segments:
        segment.close()


def _layout(flags: int, index: bytes, timeindex: bytes, log: bytes, second: tuple[int, bytes] | None = None) -> bytes:
    out = bytes([flags]) + b"".join(_U16.pack(len(part)) + part for part in (index, timeindex, log))
    if second is not None:
        out += _U16.pack(second[0]) + second[1]
    return out


async def _write_log(directory: Path) -> None:
    log = Log.open(
        directory,
        LogConfig(segment_max_bytes=1500, index_interval_bytes=INDEX_INTERVAL_BYTES, flush_policy=FlushPolicy.NEVER),
    )
    for i in range(12):
        batch = build_batch([NewRecord(f"v{i}-{j}".encode() * 8) for j in range(3)], timestamp=1_000 + i)
        await log.append(batch, 1 + i // 6)
    await log.close()


def _sample_segments() -> tuple[bytes, bytes, bytes, tuple[int, bytes]]:
    """A real log's first segment (offset index, time index, log) and its second segment (base offset, log)."""
    with tempfile.TemporaryDirectory(prefix="tidelog-fuzz-seed-") as name:
        directory = Path(name)
        asyncio.run(_write_log(directory))
        logs = sorted(directory.glob("*" + LOG_SUFFIX))
        first, second = logs[0], logs[1]
        index = first.with_suffix(INDEX_SUFFIX).read_bytes()
        timeindex = first.with_suffix(TIMEINDEX_SUFFIX).read_bytes()
        return index, timeindex, first.read_bytes(), (int(second.stem), second.read_bytes())


def _recovery_seeds() -> list[bytes]:
    index, timeindex, log, tail = _sample_segments()
    torn = log[: len(log) - 7]
    flipped = bytearray(log)
    flipped[len(log) // 2] ^= 0x10
    return [
        _layout(FLAG_CLEAN, index, timeindex, log),
        _layout(0, index, timeindex, log),
        _layout(FLAG_CLEAN | FLAG_RECOVERY_POINT | FLAG_TWO_SEGMENTS, index, timeindex, log, tail),
        _layout(FLAG_TWO_SEGMENTS, index, timeindex, torn, tail),
        _layout(FLAG_TWO_SEGMENTS | FLAG_TRUNCATE, index, timeindex, bytes(flipped), tail),
        _layout(0, b"", b"", torn + b"\x00" * 64),
    ]


# ------------------------------------------------------------------------------------------------- staged segments


def decode_staged_segment(data: bytes) -> None:
    """A sealed segment file downloaded from a leader (far-horizon catch-up), checked before it is installed.

    Layout: the segment's base offset (u16), then the file. The leader is a peer, and its bytes crossed a network.
    """
    (base,) = _U16.unpack_from(data.ljust(2, b"\x00"))
    path = scratch_directory() / (segment_name(base) + LOG_SUFFIX)
    path.write_bytes(data[2:])
    verify_staged(path, base)


def _staged_seeds() -> list[bytes]:
    _, _, log, (base, second) = _sample_segments()
    return [_U16.pack(0) + log, _U16.pack(base) + second, _U16.pack(base) + log, _U16.pack(0) + log[:-9]]


CHECKPOINTS = Target("checkpoints", decode_checkpoints, CheckpointError, _checkpoint_seeds)
SEGMENT_RECOVERY = Target("segment_recovery", decode_segment_recovery, StorageError, _recovery_seeds)
STAGED_SEGMENT = Target("staged_segment", decode_staged_segment, RecordFormatError, _staged_seeds)
