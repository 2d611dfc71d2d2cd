"""The contract every decoder of untrusted bytes keeps, checked the same way by Hypothesis, atheris and CI.

A *fuzz target* wraps one decoder (wire frames, frame headers, record batches, the Liftbridge envelope, the NATS
protocol, checkpoints, segment recovery) as ``decode(data)``. For any ``data`` the decoder must:

- succeed, or raise its one typed error (``Target.error``, subclasses included) — no other exception: an
  ``IndexError``, ``struct.error``, ``RecursionError`` or ``MemoryError`` reaching a caller is a bug;
- allocate at most ``ALLOCATION_BASE + target.allocation_factor * (len(data) + target.expansion)`` bytes at its
  peak (measured with :mod:`tracemalloc` by :func:`check`): a length field claiming 4 GiB must not make the
  decoder reserve it. ``expansion`` is what the input may legitimately grow into beyond its own size: only
  compressed record batches have one, the decompression bound the decoder is given;
- terminate: every loop is bounded by the input. Hypothesis and the corpus replay run each input once;
  atheris's ``-timeout`` turns a hang into a reported crash.

:func:`check` raises :class:`ContractViolation` (an ``AssertionError``, so pytest and atheris both report it)
naming the target and the input. The corpus of each target (``fuzz/corpus/<name>/``) is read and written here;
the targets themselves are in :mod:`tidelog.testing.fuzz_targets`.
"""

from __future__ import annotations

import hashlib
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ALLOCATION_BASE = 1024 * 1024
"""Fixed allowance for any decode: interpreter caches, a decompression step, a scratch directory's paths."""

MAX_CORPUS_INPUT = 64 * 1024
"""Largest corpus file kept: small inputs replay fast in CI and are what fuzzers mutate best."""


@dataclass(frozen=True, slots=True)
class Target:
    """One decoder under the contract: how to run it, what it may raise, and valid inputs to start from."""

    name: str  # also the corpus directory and the atheris script: fuzz/corpus/<name>, fuzz/fuzz_<name>.py
    decode: Callable[[bytes], object]  # runs the decoder on ``data``; the result is discarded
    error: type[Exception]  # the one error type bad input may raise (subclasses included)
    seeds: Callable[[], list[bytes]]  # well-formed inputs and a few hostile ones: the corpus's start
    allocation_factor: int = 8  # bytes the decoder may hold per input byte (views, copies, decoded objects)
    expansion: int = 0  # bytes the input may decompress to beyond its own size (the decoder's bound)


class ContractViolation(AssertionError):
    """A decoder broke its contract on one input: another exception, too much memory, or an inconsistency."""

    def __init__(self, target: str, data: bytes, problem: str) -> None:
        head = data[:64].hex()
        more = f"… ({len(data)} bytes)" if len(data) > 64 else f" ({len(data)} bytes)"
        super().__init__(f"fuzz target {target}: {problem}; input {head}{more}")
        self.target = target
        self.data = data
        self.problem = problem


def run(target: Target, data: bytes) -> None:
    """Decode ``data``; its own error is an accepted outcome, any other exception a :class:`ContractViolation`."""
    try:
        target.decode(data)
    except target.error:
        return
    except ContractViolation:
        raise
    except Exception as exc:
        raise ContractViolation(target.name, data, f"raised {type(exc).__name__}: {exc}") from exc


def check(target: Target, data: bytes) -> int:
    """:func:`run` with the peak allocation measured and bounded; returns the peak in bytes.

    Starts :mod:`tracemalloc` when it is not running (and stops it again after), so it can be called from a
    plain test; tracing makes the decoder a few times slower, which is why atheris runs use ``run``.
    """
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        run(target, data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if started:
            tracemalloc.stop()
    used = max(0, peak - before)
    bound = allocation_bound(target, data)
    if used > bound:
        raise ContractViolation(target.name, data, f"allocated {used} bytes, above its bound of {bound}")
    return used


def allocation_bound(target: Target, data: bytes) -> int:
    """The most ``target`` may allocate decoding ``data``."""
    return ALLOCATION_BASE + target.allocation_factor * (len(data) + target.expansion)


def same_outcome(target: str, data: bytes, first: object, second: object) -> None:
    """Two ways of decoding one input (whole and in pieces, say) must agree; raise if they do not."""
    if first != second:
        raise ContractViolation(target, data, f"decoding it two ways disagrees: {first!r:.300} != {second!r:.300}")


# ------------------------------------------------------------------------------------------------- corpus


def corpus_name(data: bytes) -> str:
    """A corpus file's name: the first 16 hex digits of its SHA-1 (libFuzzer names its finds by SHA-1 too)."""
    return hashlib.sha1(data).hexdigest()[:16]


def corpus_files(directory: Path) -> Iterator[Path]:
    """The files of one target's corpus, in name order (missing directory: none)."""
    if directory.is_dir():
        yield from sorted(path for path in directory.iterdir() if path.is_file())


def write_corpus(target: Target, directory: Path) -> int:
    """Add ``target``'s seeds to its corpus directory (existing files are kept); returns how many were new."""
    directory.mkdir(parents=True, exist_ok=True)
    added = 0
    for data in target.seeds():
        if len(data) > MAX_CORPUS_INPUT:
            raise ValueError(f"{target.name}: a seed of {len(data)} bytes is above {MAX_CORPUS_INPUT}")
        path = directory / corpus_name(data)
        if not path.exists():
            path.write_bytes(data)
            added += 1
    return added


def replay(target: Target, directory: Path) -> int:
    """:func:`check` every input of a corpus directory; returns how many were replayed."""
    count = 0
    for path in corpus_files(directory):
        check(target, path.read_bytes())
        count += 1
    return count
