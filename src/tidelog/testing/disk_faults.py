"""Disk faults on a stopped broker's files, with Jepsen's ``corrupt-file`` meanings (issue 23, item 2).

Each function damages one file in place and says what it did, so a report can name it:

- :func:`flip_bits` — bit rot: ``count`` random bits flipped between two positions;
- :func:`truncate_tail` — a lost tail: the file cut at a random point in its last ``fraction``;
- :func:`roll_back` — a chunk rolled back to an older copy of the same file (a write the disk "forgot"), the
  older copy taken by :func:`snapshot` earlier.

They are meant for files of a broker that is not running (killed or stopped), on a minority of the replicas,
as in Jepsen's analyses: the question is whether the cluster notices and repairs, never acknowledging anything
that is then lost. :func:`partition_files` finds a partition's files in a broker's data directory.
"""

from __future__ import annotations

import random
from pathlib import Path

__all__ = ["data_end", "flip_bits", "partition_files", "roll_back", "snapshot", "truncate_tail"]


def partition_files(data_dir: Path, stream: str, partition: int, suffix: str = ".log") -> list[Path]:
    """The files named ``*suffix`` (``.log``, or a whole name such as ``hw-checkpoint``) of ``stream``'s
    ``partition`` under a broker's data directory, by name."""
    return sorted(data_dir.glob(f"streams/{stream}@*/{partition}/*{suffix}"))


def data_end(path: Path) -> int:
    """One past the last non-zero byte of ``path``: a log segment's batches end there, before any zeros
    written ahead of time (preallocation), so damage aimed below it hits stored records."""
    data = path.read_bytes()
    return len(data.rstrip(b"\0"))


def flip_bits(path: Path, rng: random.Random, *, count: int = 1, start: int = 0, end: int | None = None) -> str:
    """Flip ``count`` random bits of ``path`` in ``[start, end)`` (the whole file by default)."""
    data = bytearray(path.read_bytes())
    stop = len(data) if end is None else min(end, len(data))
    if stop <= start:
        return f"{path.name}: nothing to flip in [{start}, {stop})"
    positions = sorted(rng.randrange(start, stop) for _ in range(count))
    for position in positions:
        data[position] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return f"{path.name}: flipped {count} bit(s) at byte(s) {', '.join(map(str, positions))} of {len(data)}"


def truncate_tail(path: Path, rng: random.Random, *, fraction: float = 0.5) -> str:
    """Cut ``path`` at a random point within the last ``fraction`` of its data (:func:`data_end`)."""
    size = data_end(path)
    if size == 0:
        return f"{path.name}: empty, nothing to cut"
    cut = rng.randrange(int(size * (1 - fraction)), size)
    with path.open("r+b") as file:
        file.truncate(cut)
    return f"{path.name}: cut from {size} to {cut} bytes"


def snapshot(path: Path) -> bytes:
    """The bytes of ``path`` now, for a later :func:`roll_back`."""
    return path.read_bytes()


def roll_back(path: Path, older: bytes, rng: random.Random, *, chunk: int = 4096) -> str:
    """Put back an older copy of one ``chunk``-byte region: where the older copy had bytes, they replace the
    current ones; past its end, the region becomes zeros (a write that never reached the platter)."""
    data = bytearray(path.read_bytes())
    used = data_end(path)
    if not used:
        return f"{path.name}: empty, nothing to roll back"
    start = rng.randrange(0, used) // chunk * chunk
    end = min(start + chunk, len(data))
    old = older[start:end]
    data[start:end] = old + bytes(end - start - len(old))
    path.write_bytes(bytes(data))
    return f"{path.name}: bytes [{start}, {end}) rolled back ({len(old)} from the older copy)"
