"""A leader's view of its partition's registers: recovered from the log, kept current by commits.

Registers travel in the batches of transactional appends (the registers block, :mod:`tidelog.protocol.records`),
each block holding the whole set, so a replica's registers are those of the last such batch in its log: there
is no separate replication, truncation or recovery of registers — the log's own rules carry them.

A replica does not track them while it follows. A leader learns them on first need (the first transactional
append it serves), by scanning its log from the last checkpoint for registers blocks; a failover of a stream
that never uses registers therefore costs nothing. The checkpoint (``registers-checkpoint``,
:class:`~tidelog.replication.idempotence.register_history.RegisterCheckpoint`) is written with the committed registers
at the high watermark, which is never truncated, so it can be trusted by any later leader whose log still reaches
that offset; what lies above it is rescanned.
"""

from __future__ import annotations

import asyncio
import logging

from tidelog.protocol.labels import EMPTY, LabelSet, MalformedRegistersError, decode_labels
from tidelog.protocol.records import iter_batches, registers_block
from tidelog.replication.idempotence.register_history import RegisterCheckpoint, RegisterHistory
from tidelog.storage.errors import CheckpointError
from tidelog.storage.log import Log

log = logging.getLogger(__name__)

REGISTERS_CHECKPOINT_FILE = "registers-checkpoint"
SCAN_BYTES = 4 * 1024 * 1024  # read per step of a recovery scan (the loop gets a turn between steps)


class PartitionRegisters:
    """The registers of a partition this broker leads (see the module docstring)."""

    def __init__(self, log_: Log) -> None:
        self._log = log_
        self._checkpoint = RegisterCheckpoint(log_.directory / REGISTERS_CHECKPOINT_FILE)
        self._history: RegisterHistory | None = None  # None until recovered
        self._recovering: asyncio.Lock = asyncio.Lock()
        self._checkpointed_floor = -1

    async def current(self) -> LabelSet:
        """The registers as of the log end, recovering them first if this leader has not yet."""
        if self._history is None:
            async with self._recovering:
                if self._history is None:
                    self._history = await self._recover()
        return self._history.latest

    @property
    def known(self) -> bool:
        return self._history is not None

    def latest_known(self) -> LabelSet:
        """The registers if recovered already, else empty (for reports that must not wait on a scan)."""
        return EMPTY if self._history is None else self._history.latest

    def committed(self, end_offset: int, registers: LabelSet) -> None:
        """An append ending at ``end_offset`` left ``registers`` (called where the log places it)."""
        if self._history is None:
            raise RuntimeError("registers changed before they were recovered")
        self._history.record(end_offset, registers)

    def forget_after(self, end_offset: int) -> None:
        """A placed append was undone (a full disk refused its write): the log ends at ``end_offset`` again."""
        if self._history is not None:
            self._history.truncate_to(end_offset)

    async def checkpoint(self, high_watermark: int) -> None:
        """Store the registers at the high watermark, when it moved past a change since the last checkpoint."""
        history = self._history
        if history is None or high_watermark <= max(history.floor, self._checkpointed_floor):
            return
        entries = history.entries()
        if not entries or entries[-1][0] <= self._checkpointed_floor:
            return  # nothing changed since the last checkpoint: the old one still says everything
        history.compact(high_watermark)
        at_floor = history.at(high_watermark)
        stored = RegisterHistory([(high_watermark, at_floor)] if at_floor else (), floor=high_watermark)
        await asyncio.to_thread(self._checkpoint.write, stored)
        self._checkpointed_floor = high_watermark

    async def _recover(self) -> RegisterHistory:
        end = self._log.end_offset
        start, registers = self._log.start_offset, EMPTY
        try:
            stored = self._checkpoint.read()
        except CheckpointError as exc:
            log.warning("%s: ignoring the registers checkpoint: %s", self._log.directory, exc)
            stored = None
        if stored is not None and self._log.start_offset <= stored.floor <= end:
            start, registers = stored.floor, stored.at(stored.floor)
        history = RegisterHistory([(start, registers)] if registers else (), floor=start)
        offset = start
        while offset < end:
            data = self._log.read(offset, SCAN_BYTES, max_offset=end)
            if not data:
                break
            for position, header in iter_batches(data, verify=False):
                block = registers_block(data, position, header=header)
                if block is not None:
                    try:
                        history.record(header.next_offset, decode_labels(block))
                    except MalformedRegistersError as exc:  # written by a leader: a bug, never a client's input
                        log.error("%s: unreadable registers at offset %d: %s", self._log.directory, offset, exc)
                offset = header.next_offset
            await asyncio.sleep(0)
        self._checkpointed_floor = start if stored is not None else -1
        return history
