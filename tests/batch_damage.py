"""A Hypothesis strategy that damages record batches: shared by the fuzz tests of every batch reader."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from tidelog.protocol.records import HEADER_SIZE, BatchHeader, parse_header


@st.composite
def damaged(draw: st.DrawFn, batches: Sequence[bytes]) -> tuple[bytes, BatchHeader]:
    """One of ``batches`` with bytes of its records changed, inserted or dropped, and maybe its counts."""
    data = draw(st.sampled_from(batches))
    header = parse_header(data)
    changed = bytearray(data)
    positions = st.integers(HEADER_SIZE, len(data) - 1)
    for _ in range(draw(st.integers(0, 4))):
        changed[draw(positions)] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        at, drop = draw(positions), draw(st.integers(0, 40))
        changed[at : at + drop] = draw(st.binary(max_size=40))
    if draw(st.booleans()):
        header = header._replace(
            record_count=max(0, header.record_count + draw(st.integers(-2, 2))),
            last_offset_delta=max(0, header.last_offset_delta + draw(st.integers(-2, 2))),
        )
    return bytes(changed), header
