"""crc32c_combine agrees with checksumming the concatenation, for every split and length."""

from __future__ import annotations

import os

import crc32c
from hypothesis import given
from hypothesis import strategies as st

from tidelog.storage.crc_combine import crc32c_combine


@given(st.binary(max_size=300), st.binary(max_size=300))
def test_combine_equals_crc_of_concatenation(a: bytes, b: bytes) -> None:
    assert crc32c_combine(crc32c.crc32c(a), crc32c.crc32c(b), len(b)) == crc32c.crc32c(a + b)


def test_combine_over_large_lengths_and_many_chunks() -> None:
    head = os.urandom(40)
    chunks = [os.urandom(n) for n in (1, 4095, 1 << 20, 3, 65537)]
    running = 0
    for chunk in chunks:  # a spool's running CRC: crc(records so far) extended chunk by chunk
        running = crc32c.crc32c(chunk, running)
    body = b"".join(chunks)
    assert running == crc32c.crc32c(body)
    assert crc32c_combine(crc32c.crc32c(head), running, len(body)) == crc32c.crc32c(head + body)


def test_empty_second_part_is_identity() -> None:
    assert crc32c_combine(0x12345678, crc32c.crc32c(b""), 0) == 0x12345678
