"""Choosing a partition for a record, the way Liftbridge clients do.

Liftbridge brokers never route records between partitions: the client picks the partition. Its rule for a
keyed record is the CRC-32 (IEEE 802.3, ``zlib.crc32``) of the key modulo the stream's partition count, so
every record with a given key lands on one partition and stays in order there. tidelog clients use the same
rule so that tidelog and Liftbridge producers writing the same stream agree on where each key lives.

Three partitioners, all pure apart from the round-robin counters:

- :class:`KeyPartitioner` — Liftbridge's key partitioner exactly: a missing key hashes as the empty key, which
  is partition 0.
- :class:`RoundRobinPartitioner` — Liftbridge's round robin: a counter per stream, ignoring keys.
- :class:`DefaultPartitioner` — tidelog's default: the key hash for keyed records, round robin for keyless
  ones, so keyless load spreads instead of piling onto partition 0 while keyed records stay where Liftbridge
  clients put them.

The partition count comes from the client's metadata; a count that changes (partitions added) moves keys, as
it does in Liftbridge and Kafka.
"""

from __future__ import annotations

import itertools
import zlib
from typing import Protocol


class Partitioner(Protocol):
    """Picks the partition of a record of ``stream`` among ``partitions`` partitions (``0 <= result < partitions``)."""

    def partition(self, stream: str, key: bytes | None, partitions: int) -> int: ...


def _check_count(partitions: int) -> None:
    if partitions < 1:
        raise ValueError(f"a stream has at least one partition, not {partitions}")


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition of ``key``: ``crc32(key) mod partitions`` (Liftbridge's rule; ``zlib.crc32`` is unsigned)."""
    _check_count(partitions)
    return zlib.crc32(key) % partitions


class KeyPartitioner:
    """Liftbridge's key partitioner: the key's CRC-32 modulo the partition count; no key counts as ``b""``."""

    __slots__ = ()

    def partition(self, stream: str, key: bytes | None, partitions: int) -> int:
        return partition_for_key(b"" if key is None else key, partitions)


class RoundRobinPartitioner:
    """Cycles through a stream's partitions, one record after another, whatever the key.

    ``next()`` on an ``itertools.count`` is atomic under the GIL, so the sync facade's threads may share one.
    """

    __slots__ = ("_counters",)

    def __init__(self) -> None:
        self._counters: dict[str, itertools.count[int]] = {}

    def partition(self, stream: str, key: bytes | None, partitions: int) -> int:
        _check_count(partitions)
        counter = self._counters.get(stream)
        if counter is None:
            counter = self._counters.setdefault(stream, itertools.count())
        return next(counter) % partitions


class DefaultPartitioner:
    """Keyed records by key hash (as Liftbridge), keyless records round robin.

    An empty key ``b""`` is a key like any other (it hashes to partition 0); only ``None`` means keyless.
    """

    __slots__ = ("_round_robin",)

    def __init__(self) -> None:
        self._round_robin = RoundRobinPartitioner()

    def partition(self, stream: str, key: bytes | None, partitions: int) -> int:
        if key is None:
            return self._round_robin.partition(stream, None, partitions)
        return partition_for_key(key, partitions)
