"""Remote segments: described and named by content, written create-only, read back by offset with every CRC checked.

A file:// store (a directory) stands in for the object store here; the same code runs against a real S3-compatible
server in ``tests/broker/test_tiering_s3.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidelog.protocol.records import NewRecord, build_batch, iter_batches
from tidelog.storage.remote_read import RemoteReader, RemoteSegmentError
from tidelog.storage.remote_segment import (
    RemoteSegment,
    SegmentUploadError,
    describe_segment,
    encode_manifest,
    partition_prefix,
)
from tidelog.storage.tiered_store import (
    StoreSettings,
    TieredStore,
    TieredStoreConfigError,
    open_store,
)

PREFIX = partition_prefix("default", "orders", 0)


def segment_bytes(base: int, batches: int, per_batch: int = 10, size: int = 300) -> bytes:
    parts = []
    offset = base
    for _ in range(batches):
        parts.append(
            build_batch(
                [NewRecord(os.urandom(size)) for _ in range(per_batch)],
                base_offset=offset,
                leader_epoch=3,
                timestamp=1_000,
            )
        )
        offset += per_batch
    return b"".join(parts)


async def upload(store: TieredStore, data: bytes, base: int) -> RemoteSegment:
    segment = describe_segment(PREFIX, data, base, ((3, 0),))
    assert await store.put_new(segment.log_name, data)
    assert await store.put_new(segment.manifest_name, encode_manifest(segment))
    return segment


@pytest.fixture
def store(tmp_path: Path) -> TieredStore:
    return open_store(StoreSettings(f"file://{tmp_path / 'store'}"))


def test_names_derive_from_offsets_and_content() -> None:
    data = segment_bytes(100, 4)
    segment = describe_segment(PREFIX, data, 100, ((1, 0), (3, 50), (4, 200)))
    assert segment.base_offset == 100 and segment.end_offset == 140
    assert segment.stem == f"{PREFIX}/{100:020d}-{140:020d}-{segment.sha256[:32]}"
    assert segment.epochs == ((3, 100),)  # the leadership in force at the base; later ones start past the end
    assert segment.index[0] == (100, 0)
    assert describe_segment(PREFIX, data, 100, ()).stem == segment.stem  # same bytes, same name


def test_a_segment_with_a_bad_batch_is_never_described_for_upload() -> None:
    data = bytearray(segment_bytes(0, 3))
    data[len(data) // 2] ^= 0xFF
    with pytest.raises(SegmentUploadError, match="not uploaded"):
        describe_segment(PREFIX, bytes(data), 0, ())


async def test_puts_never_overwrite(store: TieredStore) -> None:
    assert await store.put_new("a/b.log", b"first")
    assert not await store.put_new("a/b.log", b"second")
    assert await store.get("a/b.log") == b"first"


async def test_reads_whole_batches_from_any_offset_across_segments(store: TieredStore) -> None:
    first, second = segment_bytes(0, 30), segment_bytes(300, 30)
    segments = [await upload(store, first, 0), await upload(store, second, 300)]
    reader = RemoteReader(store, chunk_bytes=4096)  # small chunks: batches straddle them
    offset, seen = 0, []
    for _ in range(1000):
        data = await reader.read(segments, offset, 5000)
        if not data:
            break
        for _, header in iter_batches(data):
            seen.append(header.base_offset)
            offset = header.next_offset
    assert seen == list(range(0, 600, 10))
    middle = await reader.read(segments, 155, 1)
    assert next(iter_batches(middle))[1].base_offset == 150  # the batch holding the offset, whole
    assert await reader.read(segments, 600, 100) == b""
    assert await reader.read(segments, 0, 10**6, max_offset=25) == first[: 2 * len(first) // 30]


async def test_a_missing_object_is_an_error_naming_its_offsets(store: TieredStore) -> None:
    segment = await upload(store, segment_bytes(0, 5), 0)
    await store.delete(segment.log_name)
    with pytest.raises(RemoteSegmentError, match=r"offsets 0\.\.49 .*missing"):
        await RemoteReader(store).read([segment], 0, 100)


async def test_a_corrupt_batch_is_never_served(store: TieredStore, tmp_path: Path) -> None:
    data = bytearray(segment_bytes(0, 5))
    segment = await upload(store, bytes(data), 0)
    path = tmp_path / "store" / segment.log_name
    rotten = bytearray(path.read_bytes())
    second = len(rotten) // 5
    rotten[second + 100] ^= 0xFF  # inside the second batch's records
    path.write_bytes(bytes(rotten))
    reader = RemoteReader(store)
    assert next(iter_batches(await reader.read([segment], 0, 1)))[1].base_offset == 0  # the first is sound
    with pytest.raises(RemoteSegmentError, match=r"offsets 10\.\.19"):
        await RemoteReader(store).read([segment], 10, 1)


async def test_bad_store_urls_are_refused(tmp_path: Path) -> None:
    for url in ("ftp://x", "file://relative/path", "s3://"):
        with pytest.raises(TieredStoreConfigError):
            open_store(StoreSettings(url))
    with pytest.raises(TieredStoreConfigError, match="go together"):
        open_store(StoreSettings("s3://bucket", access_key_id="a"))


async def test_a_sequential_scan_fetches_each_chunk_once_and_reads_ahead(store: TieredStore) -> None:
    data = segment_bytes(0, 40)
    segment = await upload(store, data, 0)
    chunk = 4096
    reader = RemoteReader(store, chunk_bytes=chunk, read_ahead=3)
    await reader.read([segment], 0, 1)
    assert reader.remote_reads == 4  # the chunk holding offset 0, and the three requested ahead
    offset = 0
    for _ in range(1000):
        got = await reader.read([segment], offset, 3000)
        if not got:
            break
        offset = [h for _, h in iter_batches(got)][-1].next_offset
    assert offset == 400
    assert reader.remote_reads == -(-len(data) // chunk)  # every chunk once, none twice


async def test_read_ahead_runs_on_into_the_next_segment(store: TieredStore) -> None:
    chunk = 4096
    first = await upload(store, segment_bytes(0, 1), 0)  # one batch of ten records: within one chunk
    second = await upload(store, segment_bytes(10, 5), 10)  # five: in four chunks
    assert first.size <= chunk < second.size
    reader = RemoteReader(store, chunk_bytes=chunk, read_ahead=2)
    await reader.read([first, second], 0, 1)
    assert reader.remote_reads == 3  # the first segment's one chunk, then the second's first two
    got = await reader.read([first, second], 10, 2 * chunk)
    assert next(h.base_offset for _, h in iter_batches(got)) == 10
    assert reader.remote_reads == 3 + 2  # what it needed had arrived: it asked only for the two after it
