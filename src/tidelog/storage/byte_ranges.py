"""The verified parts of a segment file: a set of disjoint half-open byte ranges, merged as they are added.

A segment records which of its bytes this process has checked the CRCs of (appended bytes were validated before
they were written; recovery and reads verify the rest), so a read that only covers verified bytes is served
without checking them again.
"""

from __future__ import annotations


class ByteRanges:
    """A set of disjoint half-open byte ranges, merged as they are added (the verified parts of a file).

    Appends and sequential reads extend one range, so the list stays at one or a few elements.
    """

    __slots__ = ("_ranges",)

    def __init__(self) -> None:
        self._ranges: list[tuple[int, int]] = []

    def add(self, start: int, end: int) -> None:
        if start >= end:
            return
        ranges = self._ranges
        if ranges and ranges[-1][0] <= start <= ranges[-1][1]:  # the common case: extending the last range
            if end > ranges[-1][1]:
                ranges[-1] = (ranges[-1][0], end)
            return
        kept: list[tuple[int, int]] = []
        for s, e in self._ranges:
            if e < start or s > end:
                kept.append((s, e))
            else:
                start, end = min(s, start), max(e, end)
        kept.append((start, end))
        kept.sort()
        self._ranges = kept

    def missing(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of ``[start, end)`` not covered."""
        gaps: list[tuple[int, int]] = []
        cursor = start
        for s, e in self._ranges:
            if e <= cursor:
                continue
            if s >= end:
                break
            if s > cursor:
                gaps.append((cursor, s))
            cursor = max(cursor, e)
            if cursor >= end:
                break
        if cursor < end:
            gaps.append((cursor, end))
        return gaps

    def truncate(self, position: int) -> None:
        """Forget everything at or after ``position``."""
        self._ranges = [(s, min(e, position)) for s, e in self._ranges if s < position]

    def __repr__(self) -> str:
        return f"ByteRanges({self._ranges})"
