"""Damaged ranges of a partition log: offsets whose bytes failed their CRC on disk (bit rot) while the log ran.

Reads are zero-copy (``os.sendfile``) and a segment remembers the byte ranges it has verified once
(:mod:`tidelog.storage.segment_read`), so the broker does not CRC-check every read. Damage is found where a check
does run: a read of bytes not yet verified in this process (a sealed segment after a restart, every
:meth:`~tidelog.storage.log.Log.read`), or a fetch the client marks ``verify`` after its own CRC check failed
(the broker then reads the range into memory and checks it). The log records what it finds here:

- a :class:`DamagedRange` names the offsets ``first..last`` whose bytes cannot be trusted (the damaged batch,
  or up to the next batch that can still be found when its header is damaged too); ``last + 1`` is where
  reading resumes;
- reads never plan through a known range: a read starting before it stops just before it, and a read starting
  inside it fails with :class:`~tidelog.storage.errors.OffsetDamagedError` naming the range, until an operator
  confirms skipping it (``tidelog partition skip-damaged``); from then on a read inside it starts after it, the
  way a read in a compacted gap does;
- the ranges live in memory and in ``damaged-ranges.json`` in the partition directory (written atomically), so
  a restart neither forgets them nor the operator's confirmation. The file holds only offsets and notes; a file
  that cannot be parsed is logged and ignored (the damage is found again by the next read that checks it).

Ranges that fall below the log start (retention) or at or past a truncation point are dropped: the bytes they
described are gone. A replicated partition restores a range from a replica (``on_found`` starts it,
:mod:`tidelog.broker.partitions.damage_repair`); while that runs, reads inside the range are told to retry
(``OffsetDamagedError.repairing``), and a restored range is forgotten.
"""

from __future__ import annotations

import json
import logging
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tidelog.storage.atomic import write_atomically
from tidelog.storage.errors import CorruptSegmentError, OffsetDamagedError

log = logging.getLogger(__name__)

DAMAGE_FILE = "damaged-ranges.json"
_VERSION = 1


@dataclass(frozen=True, slots=True)
class DamagedRange:
    """Offsets ``first..last`` (inclusive) whose stored bytes failed validation."""

    first: int
    last: int
    reason: str = ""
    where: str = ""
    """The segment file the damage was found in."""
    confirmed: bool = False
    """An operator confirmed skipping the range: reads pass over it silently."""

    @property
    def next_offset(self) -> int:
        """Where reading resumes after the range."""
        return self.last + 1

    def describe(self) -> str:
        state = "skipped by the operator" if self.confirmed else "not yet confirmed"
        return f"offsets {self.first}..{self.last} ({state}): {self.reason}"


class DamageRegistry:
    """The damaged ranges of one log, in offset order, mirrored to :data:`DAMAGE_FILE`."""

    def __init__(self, directory: Path, ranges: list[DamagedRange]) -> None:
        self._path = directory / DAMAGE_FILE
        self._ranges = sorted(ranges, key=lambda r: r.first)
        self._repairing: set[DamagedRange] = set()
        self.found_total = 0
        """Ranges found by this process (a counter for metrics)."""
        self.repaired_total = 0
        """Ranges restored from a replica by this process (a counter for metrics)."""
        self.on_found: Callable[[DamagedRange], None] | None = None
        """Called with each newly found range (the broker starts restoring it from a replica, if it has one)."""

    @classmethod
    def load(cls, directory: Path) -> DamageRegistry:
        """The registry of ``directory``; empty when there is no file (or one that cannot be read: logged)."""
        path = directory / DAMAGE_FILE
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return cls(directory, [])
        try:
            body = json.loads(raw)
            if body.get("version") != _VERSION:
                raise ValueError(f"version {body.get('version')!r}, expected {_VERSION}")
            ranges = [DamagedRange(**item) for item in body["ranges"]]
            for item in ranges:
                if not (type(item.first) is int and type(item.last) is int and 0 <= item.first <= item.last):
                    raise ValueError(f"not a range of offsets: {item}")
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            log.error("%s cannot be read (%s): ignored; damage is found again when read", path, exc)
            return cls(directory, [])
        return cls(directory, ranges)

    @property
    def ranges(self) -> list[DamagedRange]:
        return list(self._ranges)

    def __bool__(self) -> bool:
        return bool(self._ranges)

    # ------------------------------------------------------------------------------------------ reading

    def plan(self, offset: int, limit: int) -> tuple[int, int]:
        """Where a read from ``offset`` bounded by ``limit`` may go: ``(start, limit)``.

        Raises :class:`OffsetDamagedError` when ``offset`` lies in an unconfirmed range; moves ``start`` past a
        confirmed one; lowers ``limit`` to the first range after ``start``. Cheap when there are no ranges.
        """
        for damaged in self._ranges:
            if damaged.last < offset:
                continue
            if damaged.first <= offset:
                if not damaged.confirmed:
                    repairing = damaged in self._repairing
                    raise OffsetDamagedError(damaged.first, damaged.last, damaged.reason, repairing=repairing)
                offset = damaged.next_offset
                continue
            return offset, min(limit, damaged.first)
        return offset, limit

    def covering(self, offset: int) -> DamagedRange | None:
        i = bisect_right([r.first for r in self._ranges], offset) - 1
        if i >= 0 and self._ranges[i].last >= offset:
            return self._ranges[i]
        return None

    # ------------------------------------------------------------------------------------------ changing

    def record(self, exc: CorruptSegmentError) -> DamagedRange:
        """Record the range ``exc`` names (merged with a range it overlaps); logged once, then persisted."""
        known = self.covering(exc.first_offset)
        if known is not None and known.last >= exc.last_offset:
            return known
        damaged = DamagedRange(exc.first_offset, exc.last_offset, exc.reason, exc.path)
        self._ranges = sorted(
            [r for r in self._ranges if r.last < damaged.first or r.first > damaged.last] + [damaged],
            key=lambda r: r.first,
        )
        self.found_total += 1
        log.error(
            "bit rot: %s holds damaged offsets %d..%d (%s); reads resume at %d. Restore them from a replica, or "
            "confirm skipping them with `tidelog partition skip-damaged`",
            exc.path,
            damaged.first,
            damaged.last,
            exc.reason,
            damaged.next_offset,
        )
        self._save()
        if self.on_found is not None:
            self.on_found(damaged)
        return damaged

    def repairing(self, damaged: DamagedRange, underway: bool) -> None:
        """Mark ``damaged`` as being restored from a replica (readers retry meanwhile), or no longer."""
        if underway:
            self._repairing.add(damaged)
        else:
            self._repairing.discard(damaged)

    def is_repairing(self, damaged: DamagedRange) -> bool:
        return damaged in self._repairing

    def repaired(self, damaged: DamagedRange) -> None:
        """``damaged`` holds a replica's sound copy now: forget it."""
        self._repairing.discard(damaged)
        self.repaired_total += 1
        self._set([r for r in self._ranges if r != damaged])

    def confirm(self, first: int, last: int) -> DamagedRange:
        """An operator confirms skipping the range ``first..last`` (exactly as recorded). Raises ``KeyError``
        naming the known ranges otherwise."""
        for i, damaged in enumerate(self._ranges):
            if damaged.first == first and damaged.last == last:
                if not damaged.confirmed:
                    self._ranges[i] = replace(damaged, confirmed=True)
                    self._save()
                    log.warning("damaged offsets %d..%d of %s confirmed skipped", first, last, self._path.parent)
                return self._ranges[i]
        known = ", ".join(f"{r.first}..{r.last}" for r in self._ranges) or "none"
        raise KeyError(f"no damaged range {first}..{last} is known here (known: {known})")

    def forget_from(self, offset: int) -> None:
        """The log was cut at ``offset``: ranges at or past it are gone (a range across it ends before it)."""
        kept = [r if r.last < offset else replace(r, last=offset - 1) for r in self._ranges if r.first < offset]
        self._set(kept)

    def forget_below(self, offset: int) -> None:
        """The log now starts at ``offset``: ranges wholly below it are gone."""
        self._set([r for r in self._ranges if r.last >= offset])

    def _set(self, ranges: list[DamagedRange]) -> None:
        if ranges != self._ranges:
            self._ranges = ranges
            self._save()

    def _save(self) -> None:
        body = {"version": _VERSION, "ranges": [asdict(r) for r in self._ranges]}
        if not self._ranges and not self._path.exists():
            return
        write_atomically(self._path, json.dumps(body, indent=1).encode())
