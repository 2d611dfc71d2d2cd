"""The leader epoch cache: which leader epoch wrote which offsets (Kafka KIP-101 and KIP-279).

Each entry says "epoch ``e`` began at offset ``s``"; the epoch covers offsets up to the start of the next entry
(the last one up to the log end). Entries increase strictly in both epoch and start offset. A follower that
restarts or follows a new leader asks the leader for the end of its own latest epoch
(:meth:`LeaderEpochCache.end_offset_for_epoch`) and truncates to where the two logs agree — never to the high
watermark alone, which can throw away committed data or keep divergent data (KIP-101). When the leader never
saw the follower's epoch it answers with the largest epoch it has below it, so the follower can ask again
and walk back until the histories match (KIP-279).

Who changes it:

- the log appends a batch → :meth:`~LeaderEpochCache.assign` (``batch.leader_epoch``, ``batch.base_offset``);
  a no-op unless the batch starts a new epoch, so it is cheap to call per batch;
- the log truncates its tail → :meth:`~LeaderEpochCache.truncate_from_end`;
- retention deletes a prefix → :meth:`~LeaderEpochCache.truncate_from_start`.

The file is derived data: the epoch of every batch is in its header. A damaged file (torn by hand, garbage,
another version, empty, entries out of order) is rebuilt from the batch headers when the log opens
(:meth:`LeaderEpochCache.load_or_rebuild`, logged as a WARNING), never fatal: a partition must not become
unavailable over a file it can recompute.

Every change is written to ``leader-epoch-checkpoint`` (:mod:`tidelog.storage.checkpoint`, atomic) *before*
it becomes visible in memory, so a failed write leaves the cache as it was. Writers are serialized by the owning
log; readers may run concurrently because the entries are an immutable tuple replaced as a whole.
"""

from __future__ import annotations

import bisect
import itertools
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

from tidelog.storage.checkpoint import CheckpointFile
from tidelog.storage.errors import CheckpointError

log = logging.getLogger(__name__)

LEADER_EPOCH_CHECKPOINT_FILE = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class EpochEntry(NamedTuple):
    """Leader epoch ``epoch`` wrote its first record at ``start_offset``."""

    epoch: int
    start_offset: int


class EpochEndOffset(NamedTuple):
    """The answer to "where does epoch E end?": ``(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)`` when unknown."""

    epoch: int
    end_offset: int


UNDEFINED = EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)


class LeaderEpochCache:
    """Epoch → start offset for one partition, persisted in ``leader-epoch-checkpoint``.

    Opening reads and validates the file (absent → empty); a damaged file, or one whose entries do not
    increase strictly, raises :class:`~tidelog.storage.errors.CheckpointError`.
    """

    __slots__ = ("_entries", "_file")

    KIND = "leader-epoch"

    def __init__(self, path: Path) -> None:
        self._file = CheckpointFile(path, self.KIND, 2)
        loaded = self._file.read() or []
        entries = tuple(EpochEntry(epoch, start) for epoch, start in loaded)
        try:
            _check_monotonic(entries)
        except ValueError as exc:
            raise CheckpointError(str(path), str(exc)) from exc
        self._entries = entries

    @classmethod
    def load_or_rebuild(cls, path: Path, batch_epochs: Callable[[], Iterable[tuple[int, int]]]) -> LeaderEpochCache:
        """Open the cache; if its file is damaged, rebuild it from ``batch_epochs`` (each batch's leader epoch
        and base offset, in offset order) and write it again. Blocking."""
        try:
            return cls(path)
        except CheckpointError as exc:
            damage = exc
        entries: list[EpochEntry] = []
        for epoch, base_offset in batch_epochs():
            if epoch >= 0 and (not entries or epoch > entries[-1].epoch):
                entries.append(EpochEntry(epoch, base_offset))
        path.unlink(missing_ok=True)
        cache = cls(path)
        if entries:
            cache._replace(tuple(entries))
        log.warning("%s was damaged (%s); rebuilt from the batch headers: %r", path, damage, cache)
        return cache

    # ------------------------------------------------------------------------------------------- queries

    @property
    def path(self) -> Path:
        return self._file.path

    @property
    def entries(self) -> tuple[EpochEntry, ...]:
        """All entries, oldest first."""
        return self._entries

    @property
    def latest_entry(self) -> EpochEntry | None:
        return self._entries[-1] if self._entries else None

    @property
    def latest_epoch(self) -> int:
        """The newest epoch, or ``UNDEFINED_EPOCH`` when the cache is empty."""
        return self._entries[-1].epoch if self._entries else UNDEFINED_EPOCH

    @property
    def earliest_entry(self) -> EpochEntry | None:
        return self._entries[0] if self._entries else None

    def end_offset_for_epoch(self, epoch: int, log_end_offset: int) -> EpochEndOffset:
        """Where ``epoch`` ends in this log, as KIP-279 defines it: ``(largest epoch ≤ epoch, its end offset)``.

        - the latest epoch ends at ``log_end_offset`` (it is still being written);
        - an older epoch present in the cache ends where the next higher epoch starts;
        - an epoch between two entries (this replica never saw it) answers with the largest epoch below it and
          the start of the next one, so the asking follower truncates there and asks again with that epoch;
        - an epoch below every entry, above the latest, ``UNDEFINED_EPOCH``, or any epoch while the cache is
          empty → ``(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)``.

        ``log_end_offset`` is passed in rather than read through a callback so the log can answer under its
        own lock without this cache calling back into it.
        """
        entries = self._entries
        if epoch == UNDEFINED_EPOCH or not entries:
            return UNDEFINED
        if epoch == entries[-1].epoch:
            return EpochEndOffset(epoch, log_end_offset)
        if epoch < entries[0].epoch or epoch > entries[-1].epoch:
            return UNDEFINED
        floor = bisect.bisect_right(entries, epoch, key=_epoch_of) - 1  # ≥ 0 and < len - 1 given the checks above
        return EpochEndOffset(entries[floor].epoch, entries[floor + 1].start_offset)

    # ------------------------------------------------------------------------------------------- changes

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; return whether the cache changed.

        - the latest epoch again, at or after its start: no change (the epoch simply grew);
        - an existing epoch with the same start: no change;
        - a new epoch must be greater than the latest; entries starting at or after ``start_offset`` are
          removed first (their offsets were truncated away, as when a follower truncated and now appends
          what the leader wrote in a newer epoch);
        - the latest epoch at an *earlier* start replaces its entry the same way.

        Anything else means the log and the cache disagree (an older epoch appended after a newer one without
        a truncation) and raises ``ValueError``: the caller has a bug, and guessing would corrupt the history.
        """
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"epoch {epoch} and start offset {start_offset} must not be negative")
        entries = self._entries
        if entries:
            latest = entries[-1]
            if epoch == latest.epoch and start_offset >= latest.start_offset:
                return False
            if epoch < latest.epoch:
                index = bisect.bisect_left(entries, epoch, key=_epoch_of)
                if index < len(entries) and entries[index] == (epoch, start_offset):
                    return False
                raise ValueError(f"epoch {epoch} at offset {start_offset} is older than the latest epoch {latest}")
        kept = entries[: bisect.bisect_left(entries, start_offset, key=_start_of)]
        self._replace((*kept, EpochEntry(epoch, start_offset)))
        return True

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs that start at or after ``end_offset`` (the log was truncated to end there)."""
        entries = self._entries
        if entries and entries[-1].start_offset >= end_offset:
            self._replace(entries[: bisect.bisect_left(entries, end_offset, key=_start_of)])

    def truncate_from_start(self, start_offset: int) -> None:
        """Forget epochs wholly before ``start_offset`` (a prefix of the log was deleted).

        The epoch that contains ``start_offset`` is kept, its start moved up to ``start_offset``, so the cache
        never claims offsets the log no longer has.
        """
        entries = self._entries
        first_kept = bisect.bisect_right(entries, start_offset, key=_start_of)  # entries starting after it
        if first_kept == 0:
            return
        containing = entries[first_kept - 1]
        if first_kept == 1 and containing.start_offset == start_offset:
            return
        self._replace((EpochEntry(containing.epoch, start_offset), *entries[first_kept:]))

    def clear(self) -> None:
        """Forget every epoch (the whole log was deleted or replaced)."""
        if self._entries:
            self._replace(())

    def __repr__(self) -> str:
        body = ", ".join(f"{e.epoch}@{e.start_offset}" for e in self._entries)
        return f"LeaderEpochCache([{body}])"

    # ------------------------------------------------------------------------------------------- internals

    def _replace(self, entries: tuple[EpochEntry, ...]) -> None:
        _check_monotonic(entries)
        self._file.write(entries)  # durable first: a failed write leaves memory and disk agreeing
        self._entries = entries  # one reference swap: concurrent readers see the old tuple or the new


def _epoch_of(entry: EpochEntry) -> int:
    return entry.epoch


def _start_of(entry: EpochEntry) -> int:
    return entry.start_offset


def _check_monotonic(entries: tuple[EpochEntry, ...]) -> None:
    for before, after in itertools.pairwise(entries):
        if not (before.epoch < after.epoch and before.start_offset < after.start_offset):
            raise ValueError(f"epoch entries must increase strictly: {before} then {after}")
    for entry in entries:
        if entry.epoch < 0 or entry.start_offset < 0:
            raise ValueError(f"negative epoch entry {entry}")
