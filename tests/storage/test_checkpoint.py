"""Atomic file replacement and the checkpoint format (high watermark)."""

from __future__ import annotations

import os
from contextlib import suppress
from pathlib import Path

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.storage.atomic import TEMP_SUFFIX, atomic_writer, write_atomically
from tidelog.storage.checkpoint import (
    HW_CHECKPOINT_FILE,
    CheckpointFile,
    HighWatermarkCheckpoint,
    decode_checkpoint,
    encode_checkpoint,
)
from tidelog.storage.errors import CheckpointError, StorageError

# --------------------------------------------------------------------------------------------- atomic


def test_write_atomically_creates_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "file"
    write_atomically(target, b"one")
    assert target.read_bytes() == b"one"
    write_atomically(target, b"two, longer")
    assert target.read_bytes() == b"two, longer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_failure_inside_the_block_leaves_the_target_and_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_bytes(b"original")
    with pytest.raises(RuntimeError), atomic_writer(target) as out:
        out.write(b"half of the new")
        raise RuntimeError("disk on fire")
    assert target.read_bytes() == b"original"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_failed_fsync_leaves_the_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "file"
    target.write_bytes(b"original")

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "EIO")

    monkeypatch.setattr("tidelog.storage.atomic.os.fsync", failing_fsync)
    with pytest.raises(OSError):
        write_atomically(target, b"new")
    assert target.read_bytes() == b"original"
    assert not (tmp_path / ("file" + TEMP_SUFFIX)).exists()


def test_data_and_directory_are_fsynced_before_and_after_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "file"
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync-dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync-file")
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr("tidelog.storage.atomic.os.fsync", fsync)
    monkeypatch.setattr("tidelog.storage.atomic.os.replace", replace)
    write_atomically(target, b"data")
    assert events == ["fsync-file", "rename", "fsync-dir"]


def test_a_leftover_temp_file_from_a_crash_is_harmless(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_bytes(b"committed")
    (tmp_path / ("file" + TEMP_SUFFIX)).write_bytes(b"garbage from a crash, longer than what comes next")
    assert target.read_bytes() == b"committed"  # readers never look at the temp file
    write_atomically(target, b"next")
    assert target.read_bytes() == b"next"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_custom_suffix(tmp_path: Path) -> None:
    target = tmp_path / "seg.log"
    with atomic_writer(target, suffix=".cleaned") as out:
        out.write(b"x")
        assert (tmp_path / "seg.log.cleaned").exists()
        assert not target.exists()
    assert target.read_bytes() == b"x"


# --------------------------------------------------------------------------------------------- format


def test_encoding_is_readable_text() -> None:
    data = encode_checkpoint("high-watermark", 1, [(4096,)])
    lines = data.decode().splitlines()
    assert lines[:3] == ["tidelog high-watermark 1", "1", "4096"]
    assert lines[3].startswith("crc32c ") and len(lines[3]) == len("crc32c ") + 8
    assert data.endswith(b"\n")


entries_strategy = st.lists(st.tuples(st.integers(-(1 << 63), (1 << 63) - 1), st.integers(0, 1 << 40)), max_size=20)


@given(entries_strategy)
def test_format_round_trip(entries: list[tuple[int, int]]) -> None:
    assert decode_checkpoint(encode_checkpoint("pairs", 2, entries), "pairs", 2) == entries


@settings(max_examples=200)
@given(entries_strategy.filter(bool), st.data())
def test_any_single_byte_change_is_detected(entries: list[tuple[int, int]], data: st.DataObject) -> None:
    encoded = bytearray(encode_checkpoint("pairs", 2, entries))
    position = data.draw(st.integers(0, len(encoded) - 1))
    replacement = data.draw(st.integers(0, 255).filter(lambda b: b != encoded[position]))
    encoded[position] = replacement
    with pytest.raises(CheckpointError):
        decode_checkpoint(bytes(encoded), "pairs", 2)


@given(entries_strategy, st.data())
def test_every_truncation_is_detected(entries: list[tuple[int, int]], data: st.DataObject) -> None:
    encoded = encode_checkpoint("pairs", 2, entries)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(CheckpointError):
        decode_checkpoint(encoded[:cut], "pairs", 2)


@settings(max_examples=200)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_checkpoint_error(data: bytes) -> None:
    with suppress(CheckpointError):
        decode_checkpoint(data, "pairs", 2)


def _resealed(text: str) -> bytes:
    """A checkpoint whose checksum is right but whose body is hand-written (an operator's edit)."""
    body = text.encode()
    return body + f"crc32c {crc32c.crc32c(body):08x}\n".encode()


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("tidelog pairs 1\n1\n5 6\n", None),
        ("tidelog other 1\n1\n5 6\n", "expected 'pairs'"),
        ("tidelog pairs 2\n1\n5 6\n", "version"),
        ("kafka pairs 1\n1\n5 6\n", "not a tidelog checkpoint"),
        ("tidelog pairs 1\n2\n5 6\n", "header says 2"),
        ("tidelog pairs 1\n1\n5\n", "1 fields"),
        ("tidelog pairs 1\n1\n5 6 7\n", "3 fields"),
        ("tidelog pairs 1\n1\n05 6\n", "not an integer"),
        ("tidelog pairs 1\n1\n+5 6\n", "not an integer"),
        ("tidelog pairs 1\n1\n5  6\n", "fields"),
        ("tidelog pairs 1\n1\n5 1_000\n", "not an integer"),
        ("tidelog pairs 1\n1\n5 ６\n", "not an integer"),
        ("tidelog pairs 1\n1\n5 9223372036854775808\n", "out of range"),
        ("tidelog pairs 1\n1\n5 -0\n", "not an integer"),
        ("tidelog pairs 1\n1\n-5 -12\n", None),
        ("tidelog pairs 1\n0\n", None),
        ("tidelog pairs 1\n", "missing header"),
    ],
)
def test_strict_parsing(text: str, reason: str | None) -> None:
    if reason is None:
        decode_checkpoint(_resealed(text), "pairs", 2)
    else:
        with pytest.raises(CheckpointError, match=reason):
            decode_checkpoint(_resealed(text), "pairs", 2)


def test_nothing_may_follow_the_checksum() -> None:
    with pytest.raises(CheckpointError):
        decode_checkpoint(encode_checkpoint("pairs", 2, [(1, 2)]) + b"\n", "pairs", 2)


def test_encoding_refuses_bad_entries() -> None:
    with pytest.raises(ValueError):
        encode_checkpoint("pairs", 2, [(1,)])
    with pytest.raises(ValueError):
        encode_checkpoint("pairs", 1, [(1 << 63,)])
    with pytest.raises(ValueError):
        encode_checkpoint("two words", 1, [])


def test_checkpoint_file_absent_reads_none(tmp_path: Path) -> None:
    file = CheckpointFile(tmp_path / "cp", "pairs", 2)
    assert file.read() is None
    file.write([(1, 2), (3, 4)])
    assert file.read() == [(1, 2), (3, 4)]


def test_an_oversized_file_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    with open(path, "wb") as f:
        f.truncate(64 * 1024 * 1024)  # sparse: costs nothing on disk
    with pytest.raises(CheckpointError, match="larger than"):
        CheckpointFile(path, "pairs", 2).read()


# --------------------------------------------------------------------------------------------- high watermark


def test_high_watermark_absent_gives_the_default(tmp_path: Path) -> None:
    checkpoint = HighWatermarkCheckpoint(tmp_path / HW_CHECKPOINT_FILE)
    assert checkpoint.read() == 0
    assert checkpoint.read(default=17) == 17


def test_high_watermark_round_trip_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / HW_CHECKPOINT_FILE
    HighWatermarkCheckpoint(path).write(0)
    assert HighWatermarkCheckpoint(path).read(default=5) == 0
    HighWatermarkCheckpoint(path).write(123_456_789)
    assert HighWatermarkCheckpoint(path).read() == 123_456_789
    assert path.read_text().splitlines()[:3] == ["tidelog high-watermark 1", "1", "123456789"]


def test_negative_high_watermark_is_refused(tmp_path: Path) -> None:
    checkpoint = HighWatermarkCheckpoint(tmp_path / HW_CHECKPOINT_FILE)
    with pytest.raises(ValueError):
        checkpoint.write(-1)
    (tmp_path / HW_CHECKPOINT_FILE).write_bytes(_resealed("tidelog high-watermark 1\n1\n-4\n"))
    with pytest.raises(CheckpointError, match="negative"):
        checkpoint.read()


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"42\n",
        b"tidelog high-watermark 1\n1\n42\ncrc32c 00000000\n",
        _resealed("tidelog high-watermark 1\n2\n42\n43\n"),
        _resealed("tidelog high-watermark 1\n0\n"),
        _resealed("tidelog leader-epoch 1\n1\n42\n"),
        b"\x00" * 100,
    ],
)
def test_damaged_high_watermark_raises_a_typed_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / HW_CHECKPOINT_FILE
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as info:
        HighWatermarkCheckpoint(path).read()
    assert isinstance(info.value, StorageError)
    assert info.value.path == str(path)


def test_a_torn_temp_file_does_not_affect_the_stored_high_watermark(tmp_path: Path) -> None:
    path = tmp_path / HW_CHECKPOINT_FILE
    checkpoint = HighWatermarkCheckpoint(path)
    checkpoint.write(10)
    (tmp_path / (HW_CHECKPOINT_FILE + TEMP_SUFFIX)).write_bytes(b"tidelog high-water")  # crash mid-write
    assert checkpoint.read() == 10
    checkpoint.write(11)
    assert checkpoint.read() == 11
