"""The hook through which a log tells its owner of each write, with the bytes as stored.

Storage defines it and knows nothing of who listens; the leader's replication side implements it (a leader
answers its followers' fetches parked at the log end from the write's own buffers instead of reading the file
back a turn of the loop later). A log calls its observers from inside the write, on the event loop thread,
before the write is fsynced.

An observer may ask to hear of a write *before* it reaches the file (``before_write``) when the write cannot
run short of space: one that overwrites zero-filled room (:mod:`~tidelog.storage.preallocation`, a single batch
under flush ``always``). Whatever it does with the offsets then runs alongside the log's own ``pwritev``. Such
a write fails only on an I/O error, and then the observer may already have passed its offsets on: the log is
poisoned (it refuses appends until reopened, as after a failed fsync) rather than give those offsets to other
batches (:mod:`~tidelog.storage.disk_full`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tidelog.storage.file_writes import Buffer, FileSlice


class WriteObserver(Protocol):
    """Told of each write of a log (:meth:`~tidelog.storage.log.Log.add_write_observer`)."""

    @property
    def before_write(self) -> bool:
        """True: told just before a write that cannot run short of space (module docstring), else after it."""

    def on_write(self, first_offset: int, end_offset: int, parts: Sequence[Buffer | FileSlice]) -> None:
        """A write of whole batches from ``first_offset``; ``end_offset`` is the log end once it is in.

        ``parts`` are its batches exactly as stored, in order (buffers, or a :class:`FileSlice` where the bytes
        are copied from another file in the kernel), valid during the call only. Must not raise.
        """
