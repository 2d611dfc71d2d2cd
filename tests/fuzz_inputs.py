"""Hypothesis inputs for the fuzz targets (:mod:`tidelog.testing.fuzz_targets`): shared by their property tests.

Random bytes alone rarely get past a decoder's first check, so most inputs start from a target's seeds (the
valid encodings its corpus starts from) and damage them the ways disks and hostile peers do: bits flipped, bytes
changed, a range dropped or inserted, a tail cut, an integer field overwritten with an extreme value (the 4 GiB
length), two inputs spliced.
"""

from __future__ import annotations

import functools

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tidelog.testing.fuzz_contract import Target

EXTREMES = (b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x80\x00\x00\x00", b"\x00\x00\x00\x00", b"\xff\xff")

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
"""Settings for a fuzz property: no deadline (tracemalloc slows every decode), a couple of seconds a target."""


@functools.cache
def _seeds(target: Target) -> tuple[bytes, ...]:
    return tuple(target.seeds())


@st.composite
def _damaged(draw: st.DrawFn, seeds: tuple[bytes, ...]) -> bytes:
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            data += draw(st.binary(min_size=1, max_size=16))
            continue
        at = draw(st.integers(0, len(data) - 1))
        how = draw(st.sampled_from(("flip", "byte", "drop", "insert", "cut", "extreme", "splice")))
        if how == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif how == "byte":
            data[at] = draw(st.integers(0, 255))
        elif how == "drop":
            del data[at : at + draw(st.integers(1, 16))]
        elif how == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif how == "cut":
            del data[at:]
        elif how == "extreme":
            value = draw(st.sampled_from(EXTREMES))
            data[at : at + len(value)] = value
        else:
            other = draw(st.sampled_from(seeds))
            data[at:] = other[draw(st.integers(0, len(other))) :]
    return bytes(data)


def inputs(target: Target) -> st.SearchStrategy[bytes]:
    """Bytes for ``target``: its seeds, damaged seeds, and (less often) random bytes."""
    seeds = _seeds(target)
    return st.one_of(st.sampled_from(seeds), _damaged(seeds), _damaged(seeds), st.binary(max_size=512))
