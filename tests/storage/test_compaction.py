"""Key compaction over segment files built directly with ``build_batch``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.protocol.records import Codec, NewRecord, Record, build_batch, check_batch, iter_batches, records_of
from tidelog.storage.compaction import (
    CLEANED_SUFFIX,
    CompactionResult,
    build_offset_map,
    compact_segment_files,
    remove_leftovers,
)
from tidelog.storage.errors import CorruptSegmentError

SECOND = 1_000_000_000
NOW = 1_700_000_000 * SECOND
HOUR = 3600 * SECOND
RETENTION = 24 * HOUR
FRESH = NOW - HOUR  # a tombstone this old is kept
EXPIRED = NOW - RETENTION - HOUR  # a tombstone this old goes

Rec = tuple[bytes | None, bytes | None] | tuple[bytes | None, bytes | None, int]


def batch(base_offset: int, *records: Rec, codec: Codec = Codec.NONE, control: bool = False, epoch: int = 3) -> bytes:
    """A batch of ``(key, value[, timestamp])`` records at ``base_offset``."""
    new = [NewRecord(value=r[1], key=r[0], timestamp=r[2] if len(r) == 3 else None) for r in records]
    return build_batch(
        new, timestamp=NOW, base_offset=base_offset, codec=codec, control=control, leader_epoch=epoch, producer_id=8
    )


def segment(directory: Path, *batches: bytes) -> Path:
    """Write a segment named after its first batch's base offset."""
    base = check_batch(batches[0]).base_offset if batches else 0
    path = directory / f"{base:020d}.log"
    path.write_bytes(b"".join(batches))
    return path


def contents(*paths: Path) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for p in paths for r in records_of(p.read_bytes())]


def compact(paths: Sequence[Path], upto: int = 1 << 62, now: int = NOW) -> CompactionResult:
    return compact_segment_files(paths, upto_offset=upto, now_ns=now, delete_retention_ns=RETENTION)


# --------------------------------------------------------------------------------------------- what survives


def test_the_newest_record_per_key_survives_across_segments(tmp_path: Path) -> None:
    first = segment(tmp_path, batch(0, (b"a", b"a0"), (b"b", b"b0")), batch(2, (b"a", b"a1"), (None, b"free")))
    second = segment(tmp_path, batch(4, (b"b", b"b1"), (b"c", b"c0")), batch(6, (b"a", b"a2")))
    result = compact([first, second])
    assert contents(first, second) == [(3, None, b"free"), (4, b"b", b"b1"), (5, b"c", b"c0"), (6, b"a", b"a2")]
    assert result.records_removed == 3
    assert result.segments_rewritten == 1  # the second segment keeps every record
    assert result.rewritten == (first,)


def test_keyless_records_are_always_kept(tmp_path: Path) -> None:
    path = segment(tmp_path, batch(0, *[(None, b"same")] * 5), batch(5, (b"k", b"1"), (None, b"same"), (b"k", b"2")))
    compact([path])
    assert contents(path) == [(i, None, b"same") for i in range(5)] + [(6, None, b"same"), (7, b"k", b"2")]


def test_the_empty_key_is_a_key(tmp_path: Path) -> None:
    path = segment(tmp_path, batch(0, (b"", b"1"), (None, b"x"), (b"", b"2")))
    compact([path])
    assert contents(path) == [(1, None, b"x"), (2, b"", b"2")]


def test_tombstones_expire_by_record_timestamp(tmp_path: Path) -> None:
    path = segment(
        tmp_path,
        batch(0, (b"old", b"v"), (b"fresh", b"v"), (b"gone", b"v")),
        batch(3, (b"old", None, EXPIRED), (b"fresh", None, FRESH), (b"gone", None, FRESH), (b"gone", b"back")),
    )
    compact([path])
    # the expired tombstone and everything it deleted are gone; the fresh one still masks its key's value;
    # a tombstone superseded by a newer value goes whatever its age
    assert contents(path) == [(4, b"fresh", None), (6, b"gone", b"back")]


def test_tombstone_expiry_boundary(tmp_path: Path) -> None:
    horizon = NOW - RETENTION
    path = segment(tmp_path, batch(0, (b"at", None, horizon), (b"before", None, horizon - 1)))
    compact([path])
    assert contents(path) == [(0, b"at", None)]  # removed only when strictly older than the horizon


def test_a_tombstone_is_kept_until_it_expires_then_removed(tmp_path: Path) -> None:
    path = segment(tmp_path, batch(0, (b"k", b"v")), batch(1, (b"k", None, NOW)))
    compact([path], now=NOW)
    assert contents(path) == [(1, b"k", None)]
    compact([path], now=NOW + RETENTION)
    assert contents(path) == [(1, b"k", None)]
    compact([path], now=NOW + RETENTION + 1)
    assert contents(path) == []
    assert path.exists() and path.stat().st_size == 0  # an emptied segment stays; the log decides its fate


# --------------------------------------------------------------------------------------------- the high watermark


def test_nothing_at_or_above_upto_offset_is_touched(tmp_path: Path) -> None:
    below = batch(0, (b"k", b"0"), (b"j", b"0"))
    straddling = batch(2, (b"k", b"2"), (b"k", b"3"), (b"j", b"4"))  # offsets 2..4, upto = 4
    above = batch(5, (b"k", b"5"), (b"k", b"6"))
    path = segment(tmp_path, below, straddling, above)
    compact([path], upto=4)
    data = path.read_bytes()
    assert data.endswith(straddling + above)  # byte for byte
    # k@0 is superseded by k@2/k@3, which are committed; j@0 stays: its newer record (j@4) is not committed
    below_kept = [(1, b"j", b"0")]
    untouched = [(2, b"k", b"2"), (3, b"k", b"3"), (4, b"j", b"4"), (5, b"k", b"5"), (6, b"k", b"6")]
    assert contents(path) == below_kept + untouched


def test_uncommitted_records_do_not_supersede_committed_ones(tmp_path: Path) -> None:
    path = segment(tmp_path, batch(0, (b"k", b"committed")), batch(1, (b"k", b"uncommitted")))
    assert compact([path], upto=1).segments_rewritten == 0
    assert contents(path) == [(0, b"k", b"committed"), (1, b"k", b"uncommitted")]


def test_expired_tombstones_above_upto_offset_stay(tmp_path: Path) -> None:
    path = segment(tmp_path, batch(0, (b"k", None, EXPIRED)), batch(1, (b"k", None, EXPIRED)))
    compact([path], upto=1)
    assert contents(path) == [(1, b"k", None)]


def test_build_offset_map(tmp_path: Path) -> None:
    first = segment(tmp_path, batch(0, (b"a", b"1"), (None, b"x"), (b"b", b"1")))
    second = segment(
        tmp_path,
        batch(3, (b"a", b"2"), (b"c", None)),
        batch(5, (b"ctl", b"x"), control=True),
        batch(6, (b"b", b"2"), (b"d", b"1")),  # straddles upto = 7: b@6 counts, d@7 does not
        batch(8, (b"a", b"3")),
    )
    assert build_offset_map([first, second], upto_offset=7) == {b"a": 3, b"b": 6, b"c": 4}
    assert build_offset_map([first, second], upto_offset=0) == {}


# --------------------------------------------------------------------------------------------- offsets and batches


def test_offsets_and_batch_spans_are_preserved(tmp_path: Path) -> None:
    path = segment(
        tmp_path,
        batch(10, (b"a", b"1"), (b"b", b"1"), (b"c", b"1"), codec=Codec.ZSTD),
        batch(13, (b"a", b"2"), (b"b", b"2"), codec=Codec.LZ4),
        batch(15, (b"c", b"2"), (b"x", b"1")),
    )
    compact([path])
    data = path.read_bytes()
    headers = [h for _, h in iter_batches(data)]
    # the first batch lost every record and is gone: offsets 10..12 become a gap
    assert [(h.base_offset, h.last_offset, h.record_count) for h in headers] == [(13, 14, 2), (15, 16, 2)]
    assert [h.codec for h in headers] == [Codec.LZ4, Codec.NONE]
    assert contents(path) == [(13, b"a", b"2"), (14, b"b", b"2"), (15, b"c", b"2"), (16, b"x", b"1")]


def test_a_partly_compacted_batch_keeps_its_span_codec_and_producer_fields(tmp_path: Path) -> None:
    original = batch(20, (b"a", b"1"), (b"b", b"1"), (b"a", b"2"), (b"b", b"2"), codec=Codec.ZSTD, epoch=9)
    path = segment(tmp_path, original)
    compact([path])
    (_, header), *rest = list(iter_batches(path.read_bytes()))
    old = check_batch(original)
    assert not rest
    assert header.record_count == 2
    assert (header.base_offset, header.last_offset, header.leader_epoch) == (20, 23, 9)
    assert (header.codec, header.producer_id, header.first_timestamp) == (Codec.ZSTD, old.producer_id, NOW)
    assert [r.offset for r in records_of(path.read_bytes())] == [22, 23]


def test_control_batches_are_kept_as_they_are(tmp_path: Path) -> None:
    control = batch(1, (b"k", b"marker"), (b"k", b"marker"), control=True)
    path = segment(tmp_path, batch(0, (b"k", b"1")), control, batch(3, (b"k", b"2")))
    compact([path])
    assert control in path.read_bytes()
    assert contents(path) == [(1, b"k", b"marker"), (2, b"k", b"marker"), (3, b"k", b"2")]


def test_record_timestamps_and_headers_survive(tmp_path: Path) -> None:
    new = [NewRecord(b"1", key=b"k"), NewRecord(b"2", key=b"k", headers=[("h", b"v")], timestamp=NOW + 5)]
    path = segment(tmp_path, build_batch(new, timestamp=NOW, base_offset=0))
    compact([path])
    assert list(records_of(path.read_bytes())) == [Record(1, NOW + 5, b"k", b"2", (("h", b"v"),))]


# --------------------------------------------------------------------------------------------- files


def test_unchanged_segments_are_not_rewritten(tmp_path: Path) -> None:
    path = segment(tmp_path, batch(0, (b"a", b"1"), (b"b", b"1")), batch(2, (None, b"x")))
    before = path.stat()
    result = compact([path])
    after = path.stat()
    assert result == CompactionResult(0, 0, before.st_size, before.st_size, ())
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_result_counts_and_idempotence(tmp_path: Path) -> None:
    first = segment(tmp_path, batch(0, *[(b"k", b"v" * 100)] * 10))
    second = segment(tmp_path, batch(10, (b"k", b"last")))
    third = segment(tmp_path, batch(11, (None, b"free")))
    sizes = [p.stat().st_size for p in (first, second, third)]
    result = compact([first, second, third])
    assert result.segments_rewritten == 1
    assert result.records_removed == 10
    assert result.bytes_before == sum(sizes)
    assert result.bytes_after == sum(p.stat().st_size for p in (first, second, third)) == sizes[1] + sizes[2]
    assert compact([first, second, third]) == CompactionResult(0, 0, result.bytes_after, result.bytes_after, ())


def test_a_rewrite_replaces_the_file_and_leaves_no_cleaned_file(tmp_path: Path) -> None:
    path = segment(tmp_path, batch(0, (b"k", b"1"), (b"k", b"2")))
    inode = path.stat().st_ino
    compact([path])
    assert path.stat().st_ino != inode  # a new file renamed into place, not an in-place edit
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_a_leftover_cleaned_file_is_harmless(tmp_path: Path) -> None:
    path = segment(tmp_path, batch(0, (b"k", b"1"), (b"k", b"2")))
    stray = tmp_path / (path.name + CLEANED_SUFFIX)
    stray.write_bytes(b"half-written garbage from a crash " * 100)
    other_stray = tmp_path / ("00000000000000000099.log" + CLEANED_SUFFIX)
    other_stray.write_bytes(b"junk")
    assert contents(path) == [(0, b"k", b"1"), (1, b"k", b"2")]  # the original is what counts
    compact([path])
    assert contents(path) == [(1, b"k", b"2")]
    assert not stray.exists()  # reused and renamed into place
    assert remove_leftovers(tmp_path) == [other_stray]
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    assert remove_leftovers(tmp_path) == []


def test_a_crash_before_the_rename_leaves_the_original_intact(tmp_path: Path) -> None:
    """Kill a real process at the moment it would rename: the original is whole, the stray is removable."""
    path = segment(tmp_path, batch(0, (b"k", b"1"), (b"k", b"2"), (b"j", b"1")))
    original = path.read_bytes()
    script = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from tidelog.storage import atomic
        from tidelog.storage.compaction import compact_segment_files

        atomic.os.replace = lambda src, dst: os._exit(17)  # the power goes out here
        compact_segment_files([Path({str(path)!r})], upto_offset=10, now_ns={NOW}, delete_retention_ns=1)
        """
    )
    completed = subprocess.run([sys.executable, "-c", script], check=False, timeout=60)
    assert completed.returncode == 17
    assert path.read_bytes() == original
    stray = tmp_path / (path.name + CLEANED_SUFFIX)
    assert stray.exists()
    assert [(r.offset, r.value) for r in records_of(stray.read_bytes())] == [(1, b"2"), (2, b"1")]
    assert remove_leftovers(tmp_path) == [stray]
    compact([path])
    assert contents(path) == [(1, b"k", b"2"), (2, b"j", b"1")]


# --------------------------------------------------------------------------------------------- corrupt input


def damaged_pair(tmp_path: Path) -> tuple[Path, Path, int]:
    """Two segments that both need compaction; the second has a damaged record byte in its middle batch."""
    first = segment(tmp_path, batch(0, (b"k", b"1"), (b"k", b"2")))
    good = batch(2, (b"k", b"3"))
    bad = bytearray(batch(3, (b"j", b"1"), (b"j", b"2")))
    bad[-3] ^= 0x40
    second = segment(tmp_path, good, bytes(bad), batch(5, (b"j", b"3")))
    return first, second, len(good)


def test_a_corrupt_batch_is_refused_and_no_file_is_touched(tmp_path: Path) -> None:
    first, second, position = damaged_pair(tmp_path)
    before = {p: (p.read_bytes(), p.stat().st_ino) for p in (first, second)}
    with pytest.raises(CorruptSegmentError) as info:
        compact([first, second])
    error = info.value
    assert error.path == str(second)
    assert (error.first_offset, error.last_offset) == (3, 4)
    assert f"at byte {position}" in error.reason and "CRC" in error.reason
    assert {p: (p.read_bytes(), p.stat().st_ino) for p in (first, second)} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, second.name])


def test_build_offset_map_refuses_corrupt_input(tmp_path: Path) -> None:
    first, second, _ = damaged_pair(tmp_path)
    with pytest.raises(CorruptSegmentError):
        build_offset_map([first, second], upto_offset=100)


def test_a_torn_tail_in_a_sealed_segment_is_refused(tmp_path: Path) -> None:
    whole = batch(0, (b"k", b"1"), (b"k", b"2"))
    torn = batch(2, (b"k", b"3"))
    path = segment(tmp_path, whole, torn[:-5])
    with pytest.raises(CorruptSegmentError) as info:
        compact([path])
    assert (info.value.first_offset, info.value.path) == (2, str(path))
    assert path.read_bytes() == whole + torn[:-5]


def test_an_absurd_batch_length_is_refused_without_reading_it(tmp_path: Path) -> None:
    damaged = bytearray(batch(0, (b"k", b"1")))
    damaged[8:12] = (0x7FFFFFF0).to_bytes(4, "big")
    path = tmp_path / f"{0:020d}.log"
    path.write_bytes(bytes(damaged))
    with pytest.raises(CorruptSegmentError, match="impossible length"):
        compact([path])


def test_records_that_do_not_decode_behind_a_valid_crc_are_refused(tmp_path: Path) -> None:
    """A producer computed the CRC over garbage records: compaction will not guess what they hold."""
    raw = bytearray(batch(0, (b"k", b"1"), (b"k", b"2")))
    raw[-1] = 0x7F  # the header count of the last record: now far more headers than bytes
    raw[17:21] = crc32c.crc32c(bytes(raw[21:])).to_bytes(4, "big")
    path = segment(tmp_path, bytes(raw))
    before = path.read_bytes()
    with pytest.raises(CorruptSegmentError, match="records") as info:
        compact([path])
    assert (info.value.first_offset, info.value.last_offset) == (0, 1)
    assert path.read_bytes() == before


def test_batches_going_back_in_offset_are_refused(tmp_path: Path) -> None:
    path = segment(tmp_path, batch(5, (b"k", b"1")), batch(3, (b"k", b"2")))
    with pytest.raises(CorruptSegmentError, match="goes back"):
        compact([path])


def test_an_empty_segment_is_fine(tmp_path: Path) -> None:
    path = tmp_path / f"{0:020d}.log"
    path.write_bytes(b"")
    assert compact([path]) == CompactionResult(0, 0, 0, 0, ())


# --------------------------------------------------------------------------------------------- against a model


keys = st.none() | st.sampled_from([b"a", b"b", b"c", b""])
values = st.none() | st.sampled_from([b"1", b"22", b"333"])
stamps = st.sampled_from([EXPIRED, FRESH, NOW])
log_records = st.lists(st.tuples(keys, values, stamps), min_size=1, max_size=40)
Rec3 = tuple[bytes | None, bytes | None, int]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(log_records, st.data())
def test_matches_a_model(tmp_path_factory: pytest.TempPathFactory, recs: list[Rec3], data: st.DataObject) -> None:
    directory = tmp_path_factory.mktemp("log")
    # split into batches (some control), then into segments
    batches: list[tuple[int, list[Rec3], bool, Codec]] = []
    offset = 0
    while offset < len(recs):
        size = data.draw(st.integers(1, 5))
        control = data.draw(st.integers(0, 9)) == 0
        batches.append((offset, recs[offset : offset + size], control, data.draw(st.sampled_from(list(Codec)))))
        offset += size
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(batches) - 1)), max_size=3))))
    groups = [batches[i:j] for i, j in zip([0, *cuts], [*cuts, len(batches)], strict=True) if batches[i:j]]
    paths = [
        segment(directory, *(batch(base, *rs, control=ctl, codec=codec) for base, rs, ctl, codec in group))
        for group in groups
    ]
    upto = data.draw(st.integers(0, len(recs) + 1))

    newest: dict[bytes, int] = {}
    for base, rs, ctl, _ in batches:
        for i, (key, _, _) in enumerate(rs):
            if not ctl and key is not None and base + i < upto:
                newest[key] = base + i
    expected = []
    for base, rs, ctl, _ in batches:
        touchable = not ctl and base + len(rs) - 1 < upto
        for i, (key, value, ts) in enumerate(rs):
            o = base + i
            keep = not touchable or key is None or (newest[key] == o and (value is not None or ts >= NOW - RETENTION))
            if keep:
                expected.append((o, key, value))

    result = compact(paths, upto=upto)
    assert contents(*paths) == expected
    assert result.records_removed == len(recs) - len(expected)
    assert compact(paths, upto=upto).segments_rewritten == 0  # a second pass finds nothing to do
    assert not [p for p in directory.iterdir() if p.name.endswith(CLEANED_SUFFIX)]
    for p in paths:
        for _, header in iter_batches(p.read_bytes()):
            assert header.record_count >= 1


def test_paths_may_be_given_as_os_pathlike_in_any_directory(tmp_path: Path) -> None:
    sub = tmp_path / "partition-0"
    sub.mkdir()
    path = segment(sub, batch(0, (b"k", b"1"), (b"k", b"2")))
    compact([Path(os.fspath(path))])
    assert contents(path) == [(1, b"k", b"2")]


# --------------------------------------------------------------------------------------------- compaction lag


def test_a_record_younger_than_the_compaction_lag_is_never_removed(tmp_path: Path) -> None:
    young, old = NOW - 10 * SECOND, NOW - 2 * HOUR
    first = segment(tmp_path, batch(0, (b"a", b"old-a", old), (b"b", b"young-b", young)))
    second = segment(tmp_path, batch(2, (b"a", b"new-a", young), (b"b", b"new-b", young)))
    result = compact_segment_files(
        [first, second], upto_offset=4, now_ns=NOW, delete_retention_ns=RETENTION, min_lag_ns=HOUR
    )
    # b"young-b" is superseded but younger than the lag: it stays; b"old-a" is older than the lag: it goes.
    assert contents(first, second) == [(1, b"b", b"young-b"), (2, b"a", b"new-a"), (3, b"b", b"new-b")]
    assert result.records_removed == 1


def test_without_a_lag_the_same_records_are_compacted(tmp_path: Path) -> None:
    young, old = NOW - 10 * SECOND, NOW - 2 * HOUR
    first = segment(tmp_path, batch(0, (b"a", b"old-a", old), (b"b", b"young-b", young)))
    second = segment(tmp_path, batch(2, (b"a", b"new-a", young), (b"b", b"new-b", young)))
    compact([first, second], upto=4)
    assert contents(first, second) == [(2, b"a", b"new-a"), (3, b"b", b"new-b")]


def test_several_workers_compact_to_the_same_result_as_one(tmp_path: Path) -> None:
    outcomes = []
    for workers in (1, 4):
        directory = tmp_path / str(workers)
        directory.mkdir()
        paths = [
            segment(directory, batch(base, *[(b"k%d" % (i % 3), b"%d" % (base + i)) for i in range(5)]))
            for base in range(0, 25, 5)
        ]
        result = compact_segment_files(
            paths, upto_offset=25, now_ns=NOW, delete_retention_ns=RETENTION, workers=workers
        )
        outcomes.append((contents(*paths), result.records_removed, result.bytes_after))
    assert outcomes[0] == outcomes[1]
    assert [value for _, _, value in outcomes[0][0]] == [b"22", b"23", b"24"]
