"""A read-only mapping whose edited copies share most of their memory with the original.

The metadata mirror publishes a new :class:`~tidelog.metadata.snapshot.MetadataSnapshot` on every change, and a
snapshot must never change once published (readers hold it without locks). Copying a dict of every partition
for each change made one change cost O(cluster size). A :class:`SharedMap` keeps its entries in up to
:data:`SHARDS` small dicts chosen by the key's hash: :meth:`SharedMap.edit` copies the tuple of shards and only
the shards an edit touches, and shares the others with the original. An edit of ``k`` keys in a map of ``n``
costs about ``SHARDS + k * n / SHARDS`` pointer copies (done in C), instead of ``n``; a lookup is one hash, one
tuple index and one dict lookup. A small map (a few brokers) has fewer shards, down to one, so that iterating
it costs what iterating a dict does; a map that grows past :data:`PER_SHARD` entries a shard is split again
(doubling, so the copies this takes cost O(1) per entry added, amortized).

It is enough for the sizes tidelog aims at (tens of thousands of partitions: a shard holds a few hundred); a
hash array mapped trie would be O(log n) at any size, at the price of slower lookups in pure Python.
"""

from __future__ import annotations

import itertools
from collections.abc import ItemsView, Iterable, Iterator, Mapping, ValuesView
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")

SHARDS = 128
"""The most shards a map has (a power of two, as every shard count: a key's shard is its hash's low bits)."""

PER_SHARD = 16
"""Entries per shard above which a map has more shards (until :data:`SHARDS`)."""


def _shard_count(length: int) -> int:
    count = 1
    while count < SHARDS and length > PER_SHARD * count:
        count *= 2
    return count


DELETED: Any = object()
"""The value that removes a key in :meth:`SharedMap.edit`."""


class SharedMap(Mapping[K, V]):
    """An immutable mapping; :meth:`edit` makes a changed copy that shares the untouched shards."""

    __slots__ = ("_len", "_mask", "_shards")

    def __init__(self, items: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        pairs = list(items.items() if isinstance(items, Mapping) else items)
        self._fill(pairs, _shard_count(len(pairs)))

    def _fill(self, pairs: Iterable[tuple[K, V]], count: int) -> None:
        shards: list[dict[K, V]] = [{} for _ in range(count)]
        mask = count - 1
        for key, value in pairs:
            shards[hash(key) & mask][key] = value
        self._shards: tuple[dict[K, V], ...] = tuple(shards)
        self._mask = mask
        self._len = sum(len(s) for s in shards)

    @classmethod
    def _of(cls, shards: tuple[dict[K, V], ...], length: int) -> SharedMap[K, V]:
        made: SharedMap[K, V] = cls.__new__(cls)
        made._shards, made._mask, made._len = shards, len(shards) - 1, length
        if _shard_count(length) > len(shards):  # grown: split into more shards (every entry copied, rarely)
            made._fill(itertools.chain.from_iterable(s.items() for s in shards), _shard_count(length))
        return made

    def edit(self, changes: Mapping[K, V]) -> SharedMap[K, V]:
        """A copy with ``changes`` applied: each key set to its value, or removed where the value is
        :data:`DELETED`. Only the shards the changes fall in are copied."""
        if not changes:
            return self
        shards = list(self._shards)
        copied: set[int] = set()
        length = self._len
        for key, value in changes.items():
            i = hash(key) & self._mask
            if value is DELETED and key not in shards[i]:
                continue  # nothing to remove: the shard stays shared
            if i not in copied:
                shards[i] = dict(shards[i])
                copied.add(i)
            shard = shards[i]
            if value is DELETED:
                if shard.pop(key, DELETED) is not DELETED:
                    length -= 1
            else:
                if key not in shard:
                    length += 1
                shard[key] = value
        return SharedMap._of(tuple(shards), length)

    def shards(self) -> tuple[Mapping[K, V], ...]:
        """The shards, never changed once made: a cache keyed by a shard's identity stays valid while it lives."""
        return self._shards

    def shares_with(self, other: SharedMap[Any, Any]) -> int:
        """How many shards this map and ``other`` hold in common (the same dict object): for tests."""
        return sum(1 for a, b in zip(self._shards, other._shards, strict=False) if a is b)

    def __getitem__(self, key: K) -> V:
        return self._shards[hash(key) & self._mask][key]

    def get(self, key: K, default: Any = None) -> Any:
        return self._shards[hash(key) & self._mask].get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._shards[hash(key) & self._mask]

    def __iter__(self) -> Iterator[K]:
        return itertools.chain.from_iterable(self._shards)

    def __len__(self) -> int:
        return self._len

    def values(self) -> ValuesView[V]:
        return _Values(self)

    def items(self) -> ItemsView[K, V]:
        return _Items(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SharedMap) and other.shares_with(self) == len(self._shards) == len(other._shards):
            return True
        if not isinstance(other, Mapping) or len(other) != self._len:
            return False
        return dict(self.items()) == dict(other.items())

    __hash__ = None  # type: ignore[assignment]  # mutable-looking mappings are not hashable (as dict)

    def __repr__(self) -> str:
        return f"SharedMap({dict(self.items())!r})"


class _Values(ValuesView[V]):
    """The values, iterated shard by shard (not one lookup per key)."""

    _mapping: SharedMap[Any, V]

    def __iter__(self) -> Iterator[V]:
        return itertools.chain.from_iterable(s.values() for s in self._mapping._shards)


class _Items(ItemsView[K, V]):
    """The items, iterated shard by shard (not one lookup per key)."""

    _mapping: SharedMap[K, V]

    def __iter__(self) -> Iterator[tuple[K, V]]:
        return itertools.chain.from_iterable(s.items() for s in self._mapping._shards)
