"""A sealed segment in the object store: what is uploaded, under which name, and how it is trusted.

One segment becomes two objects, both written create-only (:mod:`tidelog.storage.tiered_store`)::

    <namespace>/<stream>/<partition>/<base:020d>-<end:020d>-<sha256[:32]>.log       the segment's bytes, as on disk
    <namespace>/<stream>/<partition>/<base:020d>-<end:020d>-<sha256[:32]>.manifest  a RemoteSegment (JSON)

``end`` is exclusive (the next offset after the segment). The name is derived from the content (Gazette's
fragment names are the model): two uploads of the same segment get the same name, so a new leader retrying what a
deposed one began finds the object there and adopts it, and an object of that name can only hold those bytes. The
``.log`` goes first and the manifest second, so a manifest is only ever written for a complete segment object.

The manifest (:class:`RemoteSegment`) is what a reader needs to trust and use the segment without a broker: its
offsets, size, checksum, the leader epochs that wrote it, its newest timestamp (retention by age) and a sparse
offset index (offset → byte position, one entry every :data:`INDEX_INTERVAL` bytes), so that a read from an offset
fetches a byte range instead of the whole object. The same record is the entry of the partition's segment list in
etcd (:mod:`tidelog.metadata.remote_segments`), which is where readers plan from.

Before upload every batch's CRC is checked (a damaged segment is never offloaded); on the way back
(:mod:`tidelog.storage.remote_read`) every batch is checked again.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right

import msgspec

from tidelog.protocol.records import iter_batches
from tidelog.protocol.records.errors import CorruptBatchError
from tidelog.storage.errors import StorageError

INDEX_INTERVAL = 64 * 1024
"""About this many bytes between the manifest's index entries: the most a read fetches before its offset."""
CHECKSUM_CHARS = 32  # hex digits of the sha256 kept in the object name (128 bits)


class RemoteSegment(msgspec.Struct, frozen=True, array_like=True):
    """One uploaded segment: its objects' stem and what a reader trusts it by."""

    stem: str
    """``<prefix>/<base:020d>-<end:020d>-<checksum>``: add ``.log`` or ``.manifest``."""
    base_offset: int
    end_offset: int
    """Exclusive: the next offset after the segment's last batch."""
    size: int
    sha256: str
    epochs: tuple[tuple[int, int], ...]
    """(leader epoch, first offset) of each leadership whose batches the segment holds, in order."""
    max_timestamp: int
    """The newest record timestamp (ns) in the segment: retention by age goes by it. -1: none."""
    index: tuple[tuple[int, int], ...] = ()
    """Sparse (offset, byte position) entries, increasing; the first is (base_offset, 0)."""

    @property
    def log_name(self) -> str:
        return self.stem + ".log"

    @property
    def manifest_name(self) -> str:
        return self.stem + ".manifest"

    def position_for(self, offset: int) -> int:
        """The byte position of an index entry at or before ``offset``: a read from it meets ``offset``."""
        if not self.index:
            return 0
        i = bisect_right(self.index, offset, key=lambda entry: entry[0]) - 1
        return self.index[max(0, i)][1]

    def without_index(self) -> RemoteSegment:
        """The entry kept in etcd's list: the index stays in the manifest (it is fetched when read)."""
        return msgspec.structs.replace(self, index=())


class SegmentUploadError(StorageError):
    """A sealed segment cannot be uploaded as it is (a batch failed its CRC): it stays local."""


def partition_prefix(namespace: str, stream: str, partition: int) -> str:
    return f"{namespace}/{stream}/{partition}"


def object_stem(prefix: str, base_offset: int, end_offset: int, sha256: str) -> str:
    return f"{prefix}/{base_offset:020d}-{end_offset:020d}-{sha256[:CHECKSUM_CHARS]}"


def describe_segment(
    prefix: str, data: bytes | memoryview, base_offset: int, epochs: tuple[tuple[int, int], ...]
) -> RemoteSegment:
    """The manifest of a sealed segment's bytes: every batch CRC-checked, the index built, the checksum taken.
    Blocking (run it off the event loop). ``epochs``: the log's epoch entries, filtered here to the segment."""
    index: list[tuple[int, int]] = []
    last_indexed = -INDEX_INTERVAL
    max_ts = -1
    end = base_offset
    try:
        for position, header in iter_batches(data):
            if position - last_indexed >= INDEX_INTERVAL:
                index.append((header.base_offset, position))
                last_indexed = position
            max_ts = max(max_ts, header.max_timestamp)
            end = header.next_offset
    except CorruptBatchError as exc:
        raise SegmentUploadError(f"segment {base_offset:020d}: {exc} (not uploaded)") from None
    digest = hashlib.sha256(data).hexdigest()
    within = _epochs_within(epochs, base_offset, end)
    return RemoteSegment(
        object_stem(prefix, base_offset, end, digest),
        base_offset,
        end,
        len(data),
        digest,
        within,
        max_ts,
        tuple(index),
    )


def _epochs_within(epochs: tuple[tuple[int, int], ...], base: int, end: int) -> tuple[tuple[int, int], ...]:
    """The epoch entries covering ``[base, end)``: the one in force at ``base`` (starting there) and those after."""
    out: list[tuple[int, int]] = []
    for epoch, start in epochs:
        if start >= end:
            break
        if start <= base:
            out = [(epoch, base)]
        else:
            out.append((epoch, start))
    return tuple(out)


_manifest_encoder = msgspec.json.Encoder()
_manifest_decoder = msgspec.json.Decoder(RemoteSegment)


def encode_manifest(segment: RemoteSegment) -> bytes:
    return _manifest_encoder.encode(segment)


def decode_manifest(data: bytes) -> RemoteSegment:
    return _manifest_decoder.decode(data)


def verify_object(segment: RemoteSegment, data: bytes) -> bool:
    """Whether ``data`` is exactly the segment the manifest describes (size and sha256)."""
    return len(data) == segment.size and hashlib.sha256(data).hexdigest() == segment.sha256
