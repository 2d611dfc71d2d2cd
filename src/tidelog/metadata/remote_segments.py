"""The remote segment list: which of a partition's segments are in the tiered store, one typed record in etcd.

Key ``{prefix}/remote/{stream}/{partition:08d}`` holds a :class:`RemoteSegmentList`: the partition's uploaded
segments (:class:`~tidelog.storage.remote_segment.RemoteSegment`, without their index), in offset order. It is the
one place any reader plans from (a broker serving a read below its local log start, a Spark job planning splits):
an object in the store that the list does not name is not part of the log (an upload interrupted before it was
recorded; the next leader adopts it by name), and a segment is deleted from a broker's disk only once the list
names it.

Writes are fenced by leadership. Only the partition's leader appends to the list (after an upload) or drops its
oldest entries (retention), and each write is one etcd transaction that compares

- the partition record's ``mod_revision`` with the one the writer read it at, having seen itself as the leader
  at its epoch in that record: a deposed leader's write (the controller moved the partition meanwhile) fails;
- the list key's ``mod_revision`` with the one it read the list at: two writers never interleave.

A failed comparison is a status (``False``) and the caller reads again; the record names nothing it did not
upload, so no retry can lose or duplicate a segment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from tidelog.metadata.records import Keys, decode_partition, decode_stream
from tidelog.storage.remote_segment import RemoteSegment


class RemoteSegmentList(msgspec.Struct, frozen=True):
    """A partition's uploaded segments, oldest first, contiguous unless retention or a gap made them otherwise."""

    segments: tuple[RemoteSegment, ...] = ()
    stream_created_ns: int = 0
    """The ``created_ns`` of the stream the list belongs to: a list left by a deleted stream of the same name
    is not this stream's (readers ignore it, the next upload replaces it)."""

    offloaded_end: int = 0
    """The end of everything ever offloaded (0: nothing): what local retention may delete up to, and where the
    next upload starts, even after retention emptied the list."""

    @property
    def start_offset(self) -> int | None:
        return self.segments[0].base_offset if self.segments else None

    @property
    def end_offset(self) -> int | None:
        """Where offloaded data ends (exclusive); None when nothing was ever offloaded."""
        if self.segments:
            return max(self.segments[-1].end_offset, self.offloaded_end)
        return self.offloaded_end or None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(RemoteSegmentList)


def remote_key(keys: Keys, stream: str, partition: int) -> bytes:
    return f"{keys.prefix}/remote/{stream}/{partition:08d}".encode()


def remote_prefix(keys: Keys) -> bytes:
    return f"{keys.prefix}/remote/".encode()


def decode_list(data: bytes) -> RemoteSegmentList:
    return _decoder.decode(data)


@dataclass(frozen=True, slots=True)
class ListedSegments:
    """A list as read, with what a fenced write of it compares against."""

    segments: RemoteSegmentList
    list_revision: int  # 0: no key
    partition_revision: int  # 0: no partition key
    leader: str
    leader_epoch: int
    stream_created_ns: int | None = None  # the stream record's, at the same revision; None: no such stream


class RemoteSegmentLists:
    """Reads and fenced writes of partitions' remote segment lists."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self._client = client
        self._keys = keys

    async def read(self, stream: str, partition: int) -> ListedSegments:
        """The list and the partition record's leadership, at one etcd revision."""
        tx = self._client.transactions
        lkey = remote_key(self._keys, stream, partition)
        pkey = self._keys.partition(stream, partition)
        skey = self._keys.stream(stream)
        _, (listed, record, stream_record) = await self._client.transaction(
            compare=[], success=[tx.get(lkey), tx.get(pkey), tx.get(skey)], failure=[]
        )
        segments, list_revision = RemoteSegmentList(), 0
        if listed:
            value, meta = listed[0]
            segments, list_revision = decode_list(bytes(value)), int(meta.mod_revision)
        leader, epoch, partition_revision = "", -1, 0
        if record:
            value, meta = record[0]
            decoded = decode_partition(bytes(value))
            leader, epoch, partition_revision = decoded.leader, decoded.leader_epoch, int(meta.mod_revision)
        created = decode_stream(bytes(stream_record[0][0])).created_ns if stream_record else None
        return ListedSegments(segments, list_revision, partition_revision, leader, epoch, created)

    async def read_all(self) -> dict[tuple[str, int], RemoteSegmentList]:
        """Every partition's list (a broker's start)."""
        out: dict[tuple[str, int], RemoteSegmentList] = {}
        prefix = remote_prefix(self._keys)
        for kv in await self._client.get_prefix(prefix):
            stream, _, pid = kv.key[len(prefix) :].decode().rpartition("/")
            out[(stream, int(pid))] = decode_list(bytes(kv.value))
        return out

    async def write(
        self,
        stream: str,
        partition: int,
        read: ListedSegments,
        new: RemoteSegmentList,
    ) -> bool:
        """Replace the list read as ``read`` by ``new``, if both keys are as read (see the module doc)."""
        tx = self._client.transactions
        lkey = remote_key(self._keys, stream, partition)
        pkey = self._keys.partition(stream, partition)
        value = _encoder.encode(msgspec.structs.replace(new, segments=tuple(s.without_index() for s in new.segments)))
        if not read.partition_revision:
            return False  # the partition is gone
        succeeded, _ = await self._client.transaction(
            compare=[tx.mod(pkey) == read.partition_revision, tx.mod(lkey) == read.list_revision],
            success=[tx.put(lkey, value)],
            failure=[],
        )
        return bool(succeeded)

    async def delete(self, stream: str, partition: int, read: ListedSegments) -> bool:
        """Forget a deleted stream's list, if it is still as read and the stream still does not exist (one created
        again under the name keeps it: its leader replaces it)."""
        tx = self._client.transactions
        lkey = remote_key(self._keys, stream, partition)
        compare = [tx.mod(lkey) == read.list_revision, tx.version(self._keys.stream(stream)) == 0]
        succeeded, _ = await self._client.transaction(compare=compare, success=[tx.delete(lkey)], failure=[])
        return bool(succeeded)
