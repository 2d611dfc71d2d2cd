"""Partition choice: Liftbridge's CRC-32 key rule with hand-checked vectors, and round robin for keyless records."""

from __future__ import annotations

import threading
import zlib
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.client.partitioner import (
    DefaultPartitioner,
    KeyPartitioner,
    Partitioner,
    RoundRobinPartitioner,
    partition_for_key,
)

# crc32(b"123456789") = 0xCBF43926 = 3421780262, the standard IEEE check value. Its digits sum to 35, so
# mod 3 it is 2; it ends in 2, so mod 5 and mod 10 it is 2; its low hex digit is 6, so mod 16 it is 6.
# crc32(b"foo") = 0x8C736521 = 2356372769: digit sum 50 → mod 3 = 2; ends in 9 → mod 5 = 4; low hex 1 → mod 16 = 1.
VECTORS = [
    (b"123456789", 3, 2),
    (b"123456789", 5, 2),
    (b"123456789", 10, 2),
    (b"123456789", 16, 6),
    (b"foo", 3, 2),
    (b"foo", 5, 4),
    (b"foo", 16, 1),
    (b"", 7, 0),  # crc32 of nothing is 0
    (b"anything", 1, 0),
]


def test_the_checksums_behind_the_vectors() -> None:
    assert zlib.crc32(b"123456789") == 0xCBF43926 == 3421780262
    assert zlib.crc32(b"foo") == 0x8C736521 == 2356372769


@pytest.mark.parametrize(("key", "partitions", "expected"), VECTORS)
def test_known_vectors(key: bytes, partitions: int, expected: int) -> None:
    assert partition_for_key(key, partitions) == expected
    assert KeyPartitioner().partition("s", key, partitions) == expected
    assert DefaultPartitioner().partition("s", key, partitions) == expected


@given(key=st.binary(max_size=64), partitions=st.integers(1, 10_000))
def test_key_partition_is_in_range_and_deterministic(key: bytes, partitions: int) -> None:
    chosen = partition_for_key(key, partitions)
    assert 0 <= chosen < partitions
    assert chosen == partition_for_key(bytes(key), partitions) == zlib.crc32(key) % partitions


def test_liftbridge_key_partitioner_sends_keyless_records_to_partition_zero() -> None:
    assert {KeyPartitioner().partition("s", None, 8) for _ in range(10)} == {0}


def test_round_robin_cycles_per_stream_whatever_the_key() -> None:
    partitioner = RoundRobinPartitioner()
    assert [partitioner.partition("a", b"k", 3) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [partitioner.partition("b", None, 2) for _ in range(3)] == [0, 1, 0]
    assert partitioner.partition("a", None, 3) == 1


def test_default_partitioner_hashes_keys_and_spreads_keyless_records() -> None:
    partitioner = DefaultPartitioner()
    assert [partitioner.partition("s", None, 4) for _ in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert partitioner.partition("s", b"foo", 3) == 2
    assert partitioner.partition("s", b"", 3) == 0  # an empty key is a key


@pytest.mark.parametrize("partitioner", [KeyPartitioner(), RoundRobinPartitioner(), DefaultPartitioner()])
def test_a_stream_without_partitions_is_refused(partitioner: Partitioner) -> None:
    with pytest.raises(ValueError, match="at least one partition"):
        partitioner.partition("s", b"k", 0)


def test_round_robin_is_exact_under_threads() -> None:
    partitioner = RoundRobinPartitioner()
    chosen: list[int] = []
    lock = threading.Lock()

    def produce() -> None:
        mine = [partitioner.partition("s", None, 4) for _ in range(1000)]
        with lock:
            chosen.extend(mine)

    threads = [threading.Thread(target=produce) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert Counter(chosen) == {0: 1000, 1: 1000, 2: 1000, 3: 1000}
