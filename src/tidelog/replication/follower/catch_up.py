"""Far-horizon catch-up (seed 001): a follower too far behind copies the leader's sealed segment files.

Fetching batch by batch cannot help a follower whose log ends below the leader's log start (retention deleted
what it needs next), and is the slow way for one that is many bytes behind. Such a follower copies whole
*sealed* segment files instead, in **rounds**: each round lists the leader's sealed segments from the
follower's log end (SEGMENT_LIST), downloads the ones it lacks (SEGMENT_FETCH, in chunks) into a staging
directory, checks every batch's CRC, and installs them (:meth:`Log.install_segments`). Segments sealed while
a round copied are picked up by the next one, which is shorter; rounds stop when no sealed segment lies beyond
the log end (or too few bytes to be worth a round), and the fetcher finishes by fetching, which also covers the
active segment. The number of rounds is bounded; running out raises :class:`CatchUpIncompleteError` and the
fetcher backs off and starts again, as Rama restarts far-horizon catch-up.

Where the log end falls decides what a round does::

    log end < leader's log start      download, then Log.reset_to(first base) and install: nothing we hold extends
    inside a sealed segment           top it up by fetching to that segment's end, then list again
    at (or in a gap before) a base    download and install from there

**Never cut what this replica holds.** A follower in the lag case holds a prefix of the leader's log (epoch
truncation ran first), and part of it may be acknowledged: the leader may have counted it for its high
watermark, and this replica may even be in the ISR. Truncating it to the base of the leader's segment, to
install that segment whole, would usually be harmless (the leader's copy holds the same bytes), but between
the truncation and the install this replica would hold less than it acknowledged: if the leader failed then
and this replica were elected, committed records would be gone. So the log only ever grows here: the segment
the log end falls inside is completed by ordinary fetching (at most one segment), and whole files are only
installed from a segment boundary. The one exception is a log that ends below the leader's start: it is
replaced whole, which loses nothing the cluster needs (the leader deleted those offsets itself, below its high
watermark, and a replica whose log end is below the high watermark is not what the ISR counted on).

A segment that disappears while it is being copied (retention) or whose file changes (compaction: a new
``file_id``) is answered with OFFSET_OUT_OF_RANGE; the round starts again from a fresh listing. Anything
downloaded is discarded unless it passes every check; file I/O runs in worker threads, never on the loop.

The replica's producer state (when given) follows every change made here
(:mod:`tidelog.replication.idempotence.producer_sync`): a reset cuts it as a truncation does, installed segments and
topped-up batches are recorded from their headers. Each log change and its state update run as one shielded unit, so a
stopped fetcher never separates them.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tidelog import telemetry
from tidelog.protocol.errors import ErrorCode, from_error_body
from tidelog.protocol.frames import ProtocolError
from tidelog.protocol.messages import ErrorBody, Header
from tidelog.protocol.peer_messages import (
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    SegmentFetchRequest,
    SegmentFetchResponse,
    SegmentListRequest,
    SegmentListResponse,
    SegmentSummary,
)
from tidelog.protocol.records.errors import InvalidBatchError
from tidelog.replication.idempotence.producer_snapshot import ProducerSnapshots
from tidelog.replication.idempotence.producer_state import ProducerStateTable
from tidelog.replication.idempotence.producer_sync import after_install, after_truncation, record_replicated
from tidelog.storage.log import Log
from tidelog.storage.segment_install import StagedSegment, discard_staging, staging_directory, verify_staged
from tidelog.storage.segment_state import LOG_SUFFIX, segment_name

log = logging.getLogger(__name__)

DEFAULT_COPY_THRESHOLD_BYTES = 256 * 1024 * 1024
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_ROUNDS = 16

Send = Callable[[Header, float], Awaitable[tuple[Header, memoryview]]]
"""Send a request to the leader and await its response header and payload, within a timeout in seconds."""


class CatchUpIncompleteError(Exception):
    """The rounds ran out before the log came within fetching range of the leader: start again later."""


class _SegmentGoneError(Exception):
    """A segment being copied was deleted or rewritten on the leader: the round starts again."""


@dataclass(slots=True)
class CatchUpStats:
    """Counters of one fetcher's catch-ups (owned by its task; read them through a copy)."""

    phases: int = 0
    """Times the fetcher switched from fetching to copying segment files."""
    rounds: int = 0
    restarts: int = 0
    """Rounds begun again because a segment vanished or changed on the leader mid-copy."""
    resets: int = 0
    """Times the log was reset to the leader's start (it ended below it)."""
    segments: int = 0
    """Segment files installed."""
    bytes: int = 0
    """Bytes downloaded (installed or not)."""


@dataclass(frozen=True, slots=True)
class CopyHooks:
    """Test seams: called at points a test wants to act at (delete a leader segment, damage a download)."""

    on_chunk: Callable[[SegmentSummary, int], Awaitable[None]] | None = None
    """After each chunk of a segment is written to staging: the segment and the bytes downloaded so far."""
    on_downloaded: Callable[[Path], None] | None = None
    """After a file is downloaded and fsynced, before it is checked (blocking; runs on the loop)."""


class SegmentCopier:
    """Copies the leader's sealed segments into ``log`` in rounds; see the module docstring.

    One copier per fetcher leadership (it sends as ``replica_id`` at ``leader_epoch``); not reentrant.
    """

    def __init__(
        self,
        log_: Log,
        send: Send,
        stream: str,
        partition: int,
        replica_id: str,
        leader_epoch: int,
        *,
        request_timeout: float,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        max_rounds: int = DEFAULT_MAX_ROUNDS,
        near_bytes: int = 0,
        stats: CatchUpStats | None = None,
        hooks: CopyHooks | None = None,
        producers: ProducerStateTable | None = None,
    ) -> None:
        """``producers``: the replica's producer state, kept in step with what is copied (None: not tracked).

        ``near_bytes``: after the first round, stop once the sealed bytes beyond the log end are fewer than
        this (fetching them is cheaper than another round); 0 runs rounds until nothing sealed is left."""
        if chunk_bytes <= 0 or max_rounds <= 0:
            raise ValueError("chunk_bytes and max_rounds must be positive")
        self._log = log_
        self._send = send
        self._stream = stream
        self._partition = partition
        self._replica_id = replica_id
        self._leader_epoch = leader_epoch
        self._timeout = request_timeout
        self._chunk_bytes = chunk_bytes
        self._max_rounds = max_rounds
        self._near_bytes = near_bytes
        self.stats = CatchUpStats() if stats is None else stats
        self._hooks = CopyHooks() if hooks is None else hooks
        self._staging = staging_directory(log_.directory)
        self._producers = producers

    @property
    def name(self) -> str:
        return f"{self._stream}/{self._partition}"

    async def survey(self) -> tuple[SegmentListResponse, int]:
        """The leader's listing from our log end and how many sealed bytes lie beyond that end."""
        listing = await self._list()
        end = self._log.end_offset
        return listing, sum(s.size for s in _beyond(listing.segments, end))

    async def run(self) -> SegmentListResponse:
        """Copy rounds until nothing sealed worth a round lies beyond the log end; return the last listing."""
        try:
            for round_ in range(self._max_rounds):
                self.stats.rounds += 1
                listing = await self._list()
                if await self._round(listing, first=round_ == 0):
                    return listing
            raise CatchUpIncompleteError(
                f"{self.name}: still behind the leader's sealed segments after {self._max_rounds} copy rounds"
            )
        finally:
            await asyncio.to_thread(discard_staging, self._log.directory)

    async def _round(self, listing: SegmentListResponse, *, first: bool) -> bool:
        """One round; True when catch-up is over (fetching takes it from here)."""
        log_ = self._log
        end = log_.end_offset
        behind = end < listing.log_start
        segments = _beyond(listing.segments, end)
        if behind and not segments:  # the leader holds nothing sealed: start empty where its log starts
            await asyncio.shield(self._reset(listing.log_start))
            return True
        if not behind:
            if not segments:
                return True
            if not first and sum(s.size for s in segments) < self._near_bytes:
                return True
            if segments[0].base_offset < end:  # we end inside it: never cut, complete it by fetching
                await self._top_up(segments[0].next_offset)
                return False
        try:
            staged = await self._download_all(segments)
        except _SegmentGoneError as exc:
            log.info("%s: %s; starting the copy round again", self.name, exc)
            self.stats.restarts += 1
            return False
        await asyncio.shield(self._install(staged, reset=behind))
        self.stats.segments += len(staged)
        log.info(
            "%s: installed %d segment(s) copied from the leader, offsets %d..%d",
            self.name,
            len(staged),
            staged[0].base_offset,
            staged[-1].next_offset,
        )
        return False  # list again: segments may have been sealed while this round copied

    async def _install(self, staged: list[StagedSegment], *, reset: bool) -> None:
        """Install downloaded segments (after a reset to the first of them) and record their batches."""
        if reset:
            await self._reset(staged[0].base_offset)
        start = self._log.end_offset
        await self._log.install_segments(staged)
        for segment in staged:
            telemetry.catch_up_copied(segment.size)
        if self._producers is not None:
            after_install(self._producers, self._log, start)

    async def _reset(self, offset: int) -> None:
        log.warning(
            "%s: log ends at %d, below the leader's start: resetting it to %d", self.name, self._log.end_offset, offset
        )
        await self._log.reset_to(offset)
        self.stats.resets += 1
        if self._producers is not None:  # nothing of what the log held is left: as a truncation, maybe rebuilt
            after_truncation(self._producers, self._log, ProducerSnapshots(self._log.directory))

    # -- requests --------------------------------------------------------------------------------------------------

    async def _list(self) -> SegmentListResponse:
        request = SegmentListRequest(
            self._stream, self._partition, self._replica_id, self._log.end_offset, self._leader_epoch
        )
        header, _ = await self._send(request, self._timeout)
        listing = _expect(header, SegmentListResponse)
        _raise_for(listing.error)
        return listing

    async def _top_up(self, target: int) -> None:
        """Fetch until the log reaches ``target``, the end of the leader's segment it ends inside."""
        log_ = self._log
        while log_.end_offset < target:
            offset = log_.end_offset
            request = ReplicaFetchRequest(
                self._stream, self._partition, self._replica_id, offset, self._leader_epoch, self._chunk_bytes, 0
            )
            header, payload = await self._send(request, self._timeout)
            response = _expect(header, ReplicaFetchResponse)
            if response.error is not None and response.error.code == ErrorCode.OFFSET_OUT_OF_RANGE:
                return  # the leader's bounds moved (retention): the next round decides again
            _raise_for(response.error)
            if not payload:
                return
            try:
                await log_.append_as_follower(payload)
            finally:
                if self._producers is not None:
                    record_replicated(self._producers, log_, payload)

    async def _download_all(self, segments: Sequence[SegmentSummary]) -> list[StagedSegment]:
        await asyncio.to_thread(_fresh_directory, self._staging)
        return [await self._download(summary) for summary in segments]

    async def _download(self, summary: SegmentSummary) -> StagedSegment:
        """Download one sealed segment file into staging, fsync it, and check every batch."""
        path = self._staging / (segment_name(summary.base_offset) + LOG_SUFFIX)
        fd = await asyncio.to_thread(os.open, path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            position, file_id = 0, 0
            while position < summary.size:
                request = SegmentFetchRequest(
                    self._stream,
                    self._partition,
                    self._replica_id,
                    self._leader_epoch,
                    summary.base_offset,
                    position,
                    self._chunk_bytes,
                    file_id,
                )
                header, payload = await self._send(request, self._timeout)
                response = _expect(header, SegmentFetchResponse)
                if response.error is not None and response.error.code == ErrorCode.OFFSET_OUT_OF_RANGE:
                    raise _SegmentGoneError(response.error.message)
                _raise_for(response.error)
                if response.size != summary.size:  # rewritten between the listing and now
                    raise _SegmentGoneError(f"segment {summary.base_offset} changed size on the leader")
                if not payload:
                    raise ProtocolError(f"the leader sent no bytes of segment {summary.base_offset} at {position}")
                file_id = response.file_id
                await asyncio.to_thread(_write_at, fd, payload, position)
                position += len(payload)
                self.stats.bytes += len(payload)
                if self._hooks.on_chunk is not None:
                    await self._hooks.on_chunk(summary, position)
            await asyncio.to_thread(os.fsync, fd)
        finally:
            await asyncio.to_thread(os.close, fd)
        if self._hooks.on_downloaded is not None:
            self._hooks.on_downloaded(path)
        staged = await asyncio.to_thread(verify_staged, path, summary.base_offset)
        if (staged.next_offset, staged.size) != (summary.next_offset, summary.size):
            raise InvalidBatchError(
                f"segment {summary.base_offset} holds offsets up to {staged.next_offset} in {staged.size} bytes; "
                f"the leader listed {summary.next_offset} in {summary.size}"
            )
        return staged


def _beyond(segments: Sequence[SegmentSummary], end: int) -> list[SegmentSummary]:
    """The listed segments holding offsets at or after ``end``."""
    return [s for s in segments if s.next_offset > end]


def _fresh_directory(path: Path) -> None:
    discard_staging(path.parent)
    path.mkdir()


def _write_at(fd: int, data: memoryview, position: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written


def _raise_for(error: ErrorBody | None) -> None:
    if error is not None:
        raise from_error_body(error)


H = TypeVar("H", bound=Header)


def _expect(header: Header, cls: type[H]) -> H:
    if not isinstance(header, cls):
        raise ProtocolError(f"expected a {cls.__name__}, the leader answered a {type(header).__name__}")
    return header
