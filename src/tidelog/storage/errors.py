"""Errors of the storage engine.

::

    StorageError
     ├── CorruptSegmentError    a sealed segment failed validation; names the file and the offset range
     ├── OffsetOutOfRangeError  a read or truncation outside [log start, log end]
     ├── OffsetDamagedError     a read inside a range of offsets found damaged on disk (bit rot)
     ├── LogClosedError         an operation on a closed log
     ├── OffsetMismatchError    an append expecting another log end than the log has (compare-and-append)
     ├── DiskFullError          a write refused because the disk is full; nothing of it was kept (retry later)
     ├── CheckpointError        a checkpoint file (high watermark, leader epochs) that is damaged or unparsable
     ├── KeyUnavailableError    an encrypted batch this log has no (right) data key for; nothing is changed
     └── DamagedLogError        (in storage.recovery_damage) opening found damage with intact batches after it; not cut

Errors of the batch format itself (corrupt or invalid batches) are in :mod:`tidelog.protocol.records.errors`.
Expected outcomes elsewhere in tidelog are status values; these exceptions are real failures or bad input.
"""

from __future__ import annotations


class StorageError(Exception):
    """Base of every storage engine error."""


class CorruptSegmentError(StorageError):
    """A segment holds bytes that fail validation below its clean point.

    Recovery truncates a torn *tail*; damage inside data that was already sealed is never silently
    dropped. The error names the segment and the offsets whose bytes cannot be trusted.
    """

    def __init__(self, path: str, first_offset: int, last_offset: int, reason: str) -> None:
        super().__init__(f"{path}: offsets {first_offset}..{last_offset} are corrupt: {reason}")
        self.path = path
        self.first_offset = first_offset
        self.last_offset = last_offset
        self.reason = reason


class OffsetOutOfRangeError(StorageError):
    """An offset outside the log's ``[start_offset, end_offset]``."""

    def __init__(self, offset: int, start_offset: int, end_offset: int) -> None:
        super().__init__(f"offset {offset} is outside the log's range [{start_offset}, {end_offset}]")
        self.offset = offset
        self.start_offset = start_offset
        self.end_offset = end_offset


class OffsetDamagedError(StorageError):
    """A read at an offset inside ``first..last``, offsets whose bytes failed validation on disk and that no
    operator has confirmed skipping yet (:mod:`tidelog.storage.damage`). Reading resumes at ``last + 1``."""

    def __init__(self, first: int, last: int, reason: str, *, repairing: bool = False) -> None:
        super().__init__(
            f"offsets {first}..{last} are damaged on disk ({reason}); the next readable offset is {last + 1}"
        )
        self.first = first
        self.last = last
        self.reason = reason
        self.repairing = repairing
        """A replica's copy is being fetched to restore them: retry soon."""

    @property
    def next_offset(self) -> int:
        return self.last + 1


class LogClosedError(StorageError):
    """The log was closed."""


class OffsetMismatchError(StorageError):
    """An append made on the condition that the log ends at ``expected`` found it ending at ``actual``.

    Checked where the log assigns offsets, under its lock, so nothing was written and no other append can have
    slipped in between the check and the write.
    """

    def __init__(self, expected: int, actual: int) -> None:
        super().__init__(f"expected the log to end at offset {expected}, it ends at {actual}")
        self.expected = expected
        self.actual = actual


class DiskFullError(StorageError):
    """The disk (or the user's quota) is full: the write was refused and undone, and the log stays healthy.

    Nothing of the write was acknowledged or handed out, so the same write may simply be tried again once space
    is freed (:mod:`tidelog.storage.disk_full`).
    """


class CheckpointError(StorageError):
    """A checkpoint file that cannot be trusted: damaged, truncated, of another kind or version, or inconsistent.

    Checkpoints are written atomically, so a torn file is not expected; one that fails validation means the
    disk or an operator changed it, and guessing a high watermark or an epoch history could lose committed data
    or serve uncommitted data. The caller decides (rebuild from the log, or refuse to open the partition).
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class KeyUnavailableError(StorageError):
    """An encrypted batch (:mod:`tidelog.storage.encryption`) cannot be sealed or opened here: the broker has no
    data key for it (no master key, or another one), or its seal does not verify. The stored bytes are kept."""
