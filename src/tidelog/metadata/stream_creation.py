"""Creating a stream in several etcd transactions, atomically as far as anyone can see.

etcd refuses a transaction of more than ``--max-txn-ops`` operations (128 by default), and a stream may have up to
10,000 partitions, each its own key. So a creation is four steps, each one transaction, each fenced by the
controller epoch when the controller makes it (the ``transact`` callable is the
:class:`~tidelog.metadata.fenced_writer.FencedWriter`'s)::

    begin    stream key absent and no creation marker → put the marker {prefix}/creating/{stream}
             (a token of this creation and its controller epoch) and delete any partition keys left under the name
    chunks   marker still ours → put up to CHUNK_PARTITIONS partition records
    finish   marker still ours, stream key absent, first and last partition present → put the stream record and
             delete the marker
    (undo)   marker still ours, stream key absent → delete the partition keys and the marker

Nothing acts on a partition whose stream record does not exist: the mirror holds such partitions back
(:class:`~tidelog.metadata.mirror.MetadataMirror`), so brokers, the controller's plans, clients and watchers of the
mirror see the stream with all its partitions at once, when ``finish`` lands, or never. A creation that fails
midway (an etcd error, a cancelled request, a deposed controller) undoes itself where it can; where it cannot (the
controller lost its term, or died), the marker names an older controller epoch, and the next controller deletes
it and its partition keys when it is elected (:func:`clean_abandoned`), as does the next creation of that name.
Two creations of one name at once: the second finds the marker and gets ``IN_PROGRESS``, to retry.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from tidelog.metadata.fenced_writer import TxnResult
from tidelog.metadata.records import (
    CreationRecord,
    Keys,
    PartitionRecord,
    StreamConfig,
    StreamRecord,
    decode_creation,
    decode_stream,
    encode,
    encode_creation,
)
from tidelog.protocol.errors import UnavailableError

log = logging.getLogger(__name__)

CHUNK_PARTITIONS = 100
"""Partition records per transaction: below etcd's default limit of 128 operations with room to spare."""


class CreateOutcome(enum.Enum):
    """What a stream creation found."""

    CREATED = "created"
    """The stream did not exist and now does."""
    SAME_EXISTS = "same-exists"
    """The same stream already exists (:func:`differences` finds none): creation is idempotent, nothing was
    written."""
    CONFLICT = "conflict"
    """A stream with this name exists with other settings (:func:`differences` names them)."""
    IN_PROGRESS = "in-progress"
    """Another creation of this name is under way: nothing was written; retry."""


def differences(existing: StreamRecord, wanted: StreamRecord) -> list[str]:
    """How the stream ``wanted`` differs from the ``existing`` one of its name, one phrase per setting (e.g.
    ``"partitions 3 (asked for 5)"``); empty when creating ``wanted`` would make the same stream. A per-stream
    setting the request leaves to the broker default differs from one the existing stream overrides."""
    found = []
    for field in ("subject", "partitions", "replication_factor", "group"):
        have, want = getattr(existing, field), getattr(wanted, field)
        if have != want:
            found.append(f"{field} {have!r} (asked for {want!r})")
    for field in StreamConfig.__struct_fields__:
        have, want = getattr(existing.config, field), getattr(wanted.config, field)
        if have != want:
            found.append(f"{field.replace('_', '.')} {_setting(have)} (asked for {_setting(want)})")
    return found


def _setting(value: object) -> str:
    return "the broker default" if value is None else repr(value)


class Transact(Protocol):
    """One etcd transaction: ``success`` if every comparison holds, else ``failure`` (see ``FencedWriter``)."""

    def __call__(
        self, compare: Sequence[Any] = (), success: Sequence[Any] = (), failure: Sequence[Any] = ()
    ) -> Awaitable[TxnResult]: ...


def plain_transact(client: Any) -> Transact:
    """An unfenced :class:`Transact` (the metadata store's writes, for tests and tools)."""

    async def transact(
        compare: Sequence[Any] = (), success: Sequence[Any] = (), failure: Sequence[Any] = ()
    ) -> TxnResult:
        ok, responses = await client.transaction(compare=list(compare), success=list(success), failure=list(failure))
        return TxnResult(bool(ok), list(responses))

    return transact


class StreamCreation:
    """Creates streams through ``transact``, in the controller epoch ``epoch`` (0 outside a controller)."""

    def __init__(
        self,
        client: Any,
        keys: Keys,
        transact: Transact,
        epoch: int,
        *,
        chunk: int = CHUNK_PARTITIONS,
        abandoned: Callable[[CreationRecord], bool] | None = None,
    ) -> None:
        """``abandoned`` says whether a marker found in the way belongs to a creation that can no longer finish
        (default: one of an older controller epoch)."""
        if chunk < 1:
            raise ValueError(f"chunk must be at least 1, not {chunk}")
        self._tx = client.transactions
        self._keys = keys
        self._transact = transact
        self._epoch = epoch
        self._chunk = chunk
        self._abandoned = abandoned or (lambda marker: marker.epoch < epoch)

    async def create(self, stream: StreamRecord, partitions: Sequence[PartitionRecord]) -> CreateOutcome:
        """Create ``stream`` and its ``partitions`` unless the name is taken (the module docstring)."""
        marker = encode_creation(CreationRecord(uuid.uuid4().hex, self._epoch, time.time_ns()))
        outcome = await self._begin(stream, marker)
        if outcome is not None:
            return outcome
        try:
            for start in range(0, len(partitions), self._chunk):
                await self._write_chunk(stream.name, marker, partitions[start : start + self._chunk])
            await self._finish(stream, marker, partitions)
        except BaseException:
            await self._undo_quietly(stream.name, marker)
            raise
        return CreateOutcome.CREATED

    async def _begin(self, stream: StreamRecord, marker: bytes) -> CreateOutcome | None:
        """Put the marker (None) or say why not: the stream exists, or another creation of it is under way."""
        tx, name = self._tx, stream.name
        stream_key, marker_key = self._keys.stream(name), self._keys.creation(name)
        prefix = self._keys.partitions_of(name)
        for _ in range(3):
            result = await self._transact(
                compare=[tx.version(stream_key) == 0, tx.version(marker_key) == 0],
                success=[tx.put(marker_key, marker), tx.delete(prefix, range_end=prefix_end(prefix))],
                failure=[tx.get(stream_key), tx.get(marker_key)],
            )
            if result.committed:
                return None
            existing = value_of(result.responses[0])
            if existing is not None:
                same = not differences(decode_stream(existing), stream)
                return CreateOutcome.SAME_EXISTS if same else CreateOutcome.CONFLICT
            held = value_of(result.responses[1])
            if held is not None:
                if not self._abandoned(decode_creation(held)):
                    return CreateOutcome.IN_PROGRESS
                await self._undo(name, held)
        return CreateOutcome.IN_PROGRESS

    async def _write_chunk(self, name: str, marker: bytes, chunk: Sequence[PartitionRecord]) -> None:
        tx = self._tx
        result = await self._transact(
            compare=[tx.value(self._keys.creation(name)) == marker],
            success=[tx.put(self._keys.partition(p.stream, p.id), encode(p)) for p in chunk],
        )
        if not result.committed:
            raise UnavailableError(f"the creation of stream {name!r} was taken over; retry")

    async def _finish(self, stream: StreamRecord, marker: bytes, partitions: Sequence[PartitionRecord]) -> None:
        tx, name = self._tx, stream.name
        compare = [tx.value(self._keys.creation(name)) == marker, tx.version(self._keys.stream(name)) == 0]
        if partitions:
            first, last = partitions[0], partitions[-1]
            compare += [
                tx.version(self._keys.partition(name, first.id)) > 0,
                tx.version(self._keys.partition(name, last.id)) > 0,
            ]
        result = await self._transact(
            compare=compare,
            success=[tx.put(self._keys.stream(name), encode(stream)), tx.delete(self._keys.creation(name))],
        )
        if not result.committed:
            raise UnavailableError(f"the creation of stream {name!r} was interrupted; retry")

    async def _undo(self, name: str, marker: bytes) -> bool:
        """Delete the partition keys and the marker of the creation ``marker``, if it is still there and the
        stream was not created; True if they were."""
        tx = self._tx
        prefix = self._keys.partitions_of(name)
        result = await self._transact(
            compare=[tx.value(self._keys.creation(name)) == marker, tx.version(self._keys.stream(name)) == 0],
            success=[tx.delete(prefix, range_end=prefix_end(prefix)), tx.delete(self._keys.creation(name))],
        )
        return result.committed

    async def _undo_quietly(self, name: str, marker: bytes) -> None:
        """Undo a failed creation where possible; what is left, the next controller (or creation) removes."""
        try:
            await asyncio.shield(self._undo(name, marker))
        except BaseException as error:  # a deposed controller, etcd unreachable, or cancelled again
            log.warning("could not undo the failed creation of stream %s (%s); the next controller will", name, error)

    async def clean_abandoned(self, client: Any) -> int:
        """Undo every creation that can no longer finish (a marker of an older epoch); how many were undone."""
        undone = 0
        for kv in await client.get_prefix(self._keys.creations.encode()):
            marker = bytes(kv.value)
            name = kv.key.decode()[len(self._keys.creations) :]
            if self._abandoned(decode_creation(marker)) and await self._undo(name, marker):
                log.info("removed the partitions of an abandoned creation of stream %s", name)
                undone += 1
        return undone


def value_of(range_response: Any) -> bytes | None:
    """The value a transaction's ``get`` of one key found, or None for no key."""
    return bytes(range_response[0][0]) if range_response else None


def prefix_end(prefix: bytes) -> bytes:
    """The etcd range end that covers every key starting with ``prefix``."""
    end = bytearray(prefix)
    end[-1] += 1
    return bytes(end)
