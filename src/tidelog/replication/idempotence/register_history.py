"""The registers as of each log end offset, and the checkpoint file that persists them.

A partition's registers (:mod:`tidelog.protocol.labels`) change only with appends that commit records, so
they are a function of the log end. :class:`RegisterHistory` remembers them per log end offset, so that a replica
truncated by leader epoch goes back to the registers of the data it kept; :class:`RegisterCheckpoint` stores the
history in a checksummed text file (:data:`REGISTERS_CHECKPOINT_FILE`, its format drawn in the comment above it).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable
from pathlib import Path

from tidelog.protocol.labels import (
    EMPTY,
    MAX_REGISTER_LABELS,
    InvalidLabelError,
    Label,
    LabelSet,
    check_limits,
)
from tidelog.storage.atomic import write_atomically
from tidelog.storage.checkpoint import read_checkpoint_bytes, seal, unseal
from tidelog.storage.errors import CheckpointError

# ----------------------------------------------------------------------------------------------- history


class RegisterHistory:
    """The registers as of each log end offset, so truncation by leader epoch can restore them.

    Registers change only with an append that commits records, and replicas apply the same appends, so the
    registers are a function of the log end: entry ``(end, registers)`` says that from log end ``end`` (the
    end after the append that set them) the registers were ``registers``, until the next entry. Before the
    first entry the registers are empty. Only changes are recorded, so a writer that re-asserts its lock on
    every append adds nothing.

    ``floor`` bounds what is remembered: :meth:`compact` forgets entries that no offset at or above the floor
    needs (call it with the high watermark, below which the log is never truncated). Asking about an offset
    below the floor raises rather than answering from a history that no longer holds it.

    Invariants: entry offsets strictly increase and are positive; only the first entry may be at or below the
    floor; no entry repeats the registers of the one before it. Not thread-safe: the partition's owner of
    appends and truncation serializes calls, as it does for the log.
    """

    __slots__ = ("_floor", "_offsets", "_registers")

    def __init__(self, entries: Iterable[tuple[int, LabelSet]] = (), *, floor: int = 0) -> None:
        if floor < 0:
            raise ValueError(f"a register history floor cannot be negative: {floor}")
        self._floor = floor
        self._offsets: list[int] = []
        self._registers: list[LabelSet] = []
        for offset, registers in entries:
            if self._offsets and offset <= self._offsets[-1]:
                raise ValueError(f"register history offsets must increase: {offset} after {self._offsets[-1]}")
            if offset <= 0:
                raise ValueError(f"a register history offset is a log end after an append, not {offset}")
            if self._offsets and self._offsets[-1] <= floor and offset <= floor:
                raise ValueError(f"two register history entries ({self._offsets[-1]}, {offset}) at or below {floor}")
            if self._registers and self._registers[-1] == registers:
                raise ValueError(f"register history entry at {offset} repeats the registers before it")
            check_limits(registers)
            self._offsets.append(offset)
            self._registers.append(registers)

    @property
    def floor(self) -> int:
        """The lowest offset :meth:`at` can answer for."""
        return self._floor

    @property
    def latest(self) -> LabelSet:
        """The current registers: those of the last entry, or empty."""
        return self._registers[-1] if self._registers else EMPTY

    def entries(self) -> list[tuple[int, LabelSet]]:
        """``(end offset, registers)`` pairs, oldest first."""
        return list(zip(self._offsets, self._registers, strict=True))

    def at(self, offset: int) -> LabelSet:
        """The registers when the log ended at ``offset``."""
        if offset < self._floor:
            raise ValueError(f"registers below offset {self._floor} are forgotten (asked for {offset})")
        index = bisect_right(self._offsets, offset) - 1
        return self._registers[index] if index >= 0 else EMPTY

    def record(self, end_offset: int, registers: LabelSet) -> bool:
        """Note that an append ending at ``end_offset`` left ``registers``; whether an entry was added.

        ``end_offset`` must be above every recorded offset and the floor: appends only move the end forward.
        """
        last = self._offsets[-1] if self._offsets else 0
        if end_offset <= max(last, self._floor):
            raise ValueError(f"an append ending at {end_offset} cannot follow {max(last, self._floor)}")
        if registers == self.latest:
            return False
        check_limits(registers)
        self._offsets.append(end_offset)
        self._registers.append(registers)
        return True

    def truncate_to(self, offset: int) -> None:
        """Forget entries above ``offset`` after the log was truncated to end there.

        The registers become those of the last entry at or below ``offset``. Raises below the floor, where the
        entries needed were compacted away (truncating committed data is itself a fault).
        """
        if offset < self._floor:
            raise ValueError(f"cannot truncate registers to {offset}, below the floor {self._floor}")
        keep = bisect_right(self._offsets, offset)
        del self._offsets[keep:], self._registers[keep:]

    def compact(self, offset: int) -> None:
        """Raise the floor to ``offset`` and drop the entries no offset at or above it needs."""
        if offset <= self._floor:
            return
        self._floor = offset
        drop = max(bisect_right(self._offsets, offset) - 1, 0)
        del self._offsets[:drop], self._registers[:drop]

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, RegisterHistory)
            and self._floor == other._floor
            and self._offsets == other._offsets
            and self._registers == other._registers
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        shown = ", ".join(f"{offset}: {registers}" for offset, registers in self.entries())
        return f"RegisterHistory(floor={self._floor}, {{{shown}}})"


# -------------------------------------------------------------------------------------------- checkpoint
#
# File ``registers-checkpoint`` in the partition directory, text like the other checkpoints
# (:mod:`tidelog.storage.checkpoint`), but entries hold labels as well as integers::
#
#     tidelog registers 1         kind and format version
#     floor 4096                  RegisterHistory.floor
#     2                           number of entries
#     4100 author=a               end offset, then the registers as name=value, canonical order
#     5000 author=b lock=         (an entry with empty registers is the offset alone)
#     crc32c 1a2b3c4d             CRC32C of every byte above, 8 lowercase hex digits
#
# Names and values never hold "=", " " or a newline (the token rules), so the split is unambiguous. Reading is
# strict — exact header, canonical integers, a matching CRC, every RegisterHistory invariant, nothing after —
# because wrong registers would let a fenced writer through or lock out the right one.

REGISTERS_CHECKPOINT_FILE = "registers-checkpoint"
CHECKPOINT_KIND = "registers"
CHECKPOINT_VERSION = 1

_HEADER = f"tidelog {CHECKPOINT_KIND} {CHECKPOINT_VERSION}".encode()
_INTEGER = re.compile(rb"0|[1-9][0-9]{0,18}")
_INT64_MAX = (1 << 63) - 1


def encode_history(history: RegisterHistory) -> bytes:
    """The checkpoint file contents for ``history``."""
    lines = [_HEADER, f"floor {history.floor}".encode(), str(len(history.entries())).encode()]
    for offset, registers in history.entries():
        lines.append(" ".join([str(offset), *map(str, registers)]).encode())
    return seal(b"\n".join(lines) + b"\n")


def decode_history(data: bytes, *, path: str = "<registers checkpoint>") -> RegisterHistory:
    """The history a checkpoint holds; any fault raises :class:`CheckpointError` naming ``path``."""
    lines = unseal(data, path).split(b"\n")[:-1]
    if len(lines) < 3:
        raise CheckpointError(path, "missing header lines")
    if lines[0] != _HEADER:
        raise CheckpointError(path, f"not a version {CHECKPOINT_VERSION} registers checkpoint: {lines[0][:64]!r}")
    if not lines[1].startswith(b"floor "):
        raise CheckpointError(path, "no floor line")
    floor = _parse_offset(lines[1][len(b"floor ") :], path)
    count = _parse_offset(lines[2], path)
    if count != len(lines) - 3:
        raise CheckpointError(path, f"{len(lines) - 3} entries where the header says {count}")
    entries = [_parse_entry(line, path) for line in lines[3:]]
    try:
        return RegisterHistory(entries, floor=floor)
    except ValueError as exc:
        raise CheckpointError(path, str(exc)) from exc


def _parse_offset(text: bytes, path: str) -> int:
    if _INTEGER.fullmatch(text) is None or int(text) > _INT64_MAX:
        raise CheckpointError(path, f"not an offset: {text[:32]!r}")
    return int(text)


def _parse_entry(line: bytes, path: str) -> tuple[int, LabelSet]:
    offset_text, *label_texts = line.split(b" ")
    offset = _parse_offset(offset_text, path)
    if len(label_texts) > MAX_REGISTER_LABELS:
        raise CheckpointError(path, f"an entry of {len(label_texts)} labels, more than {MAX_REGISTER_LABELS}")
    labels = []
    for text in label_texts:
        name, equals, value = text.partition(b"=")
        if not equals:
            raise CheckpointError(path, f"not a name=value label: {text[:64]!r}")
        try:
            labels.append(Label(name.decode("ascii"), value.decode("ascii")))
        except (UnicodeDecodeError, InvalidLabelError) as exc:
            raise CheckpointError(path, f"bad label {text[:64]!r}: {exc}") from exc
    try:
        registers = LabelSet(labels)
    except InvalidLabelError as exc:
        raise CheckpointError(path, str(exc)) from exc
    if registers.labels != tuple(labels):
        raise CheckpointError(path, f"labels of the entry at {offset} not in canonical order")
    return offset, registers


class RegisterCheckpoint:
    """The partition's :class:`RegisterHistory` on disk, replaced atomically on every write.

    Stateless apart from its path, like :class:`tidelog.storage.checkpoint.CheckpointFile`; the owner
    serializes writes.
    """

    __slots__ = ("path",)

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> RegisterHistory | None:
        """The stored history, or ``None`` when the file does not exist."""
        data = read_checkpoint_bytes(self.path)
        if data is None:
            return None
        return decode_history(data, path=str(self.path))

    def write(self, history: RegisterHistory) -> None:
        """Store ``history`` durably (fsynced and renamed into place before this returns)."""
        write_atomically(self.path, encode_history(history))

    def __repr__(self) -> str:
        return f"RegisterCheckpoint({str(self.path)!r})"
