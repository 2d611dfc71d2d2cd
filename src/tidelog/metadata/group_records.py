"""Consumer groups as stored in etcd: one :class:`GroupRecord` per group, and the rules for group and consumer ids.

Key layout under the cluster prefix (beside the keys of :mod:`tidelog.metadata.records`)::

    {prefix}/groups/{group_id}                   GroupRecord   (written by the controller only, fenced)

A group exists while it has members: the controller writes the record when the first consumer joins and deletes
it when the last one leaves (Liftbridge's lifecycle). The record holds everything a broker needs to answer for the
group without asking anyone: the coordinator, the epoch, each member's streams and the partitions assigned to it.
Storing the assignment (rather than recomputing it on each broker) lets the next assignment start from the last
one, so a rebalance moves as few partitions as it can (:mod:`tidelog.broker.groups.assignment`), and lets any
partition leader check a ``Subscribe`` against it.

**Epochs.** Every write of a group's record sets a new epoch: ``etcd revision read before the write + 1``. The
write itself lands at a later revision, so each epoch is greater than the previous one, also across a group
deleted and joined again (the revision grows with every write to etcd, the group's delete included), and a
consumer holding an epoch of a deleted group can never pass for a member of the new one. Liftbridge's epochs are
Raft indexes, for the same reason.

**Ids.** Group and consumer ids are 1 to :data:`MAX_ID_LENGTH` characters, printable, with no ``/`` (an id is an
etcd key segment) and no whitespace; :func:`check_id` raises :class:`~tidelog.protocol.errors.InvalidArgumentError`
naming the rule.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Final

import msgspec

from tidelog.metadata.records import Keys
from tidelog.protocol.errors import InvalidArgumentError

MAX_ID_LENGTH: Final = 255
"""Longest group or consumer id, in characters (Kafka's group ids have no limit; etcd keys want one)."""


class GroupMember(msgspec.Struct, frozen=True, array_like=True):
    """One consumer of a group: the streams it consumes and the partitions assigned to it, by stream."""

    id: str
    streams: tuple[str, ...]
    assignments: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """``((stream, (partition, ...)), ...)``, streams and partitions sorted; a stream with none is left out."""

    def partitions(self) -> Iterator[tuple[str, int]]:
        """Every ``(stream, partition)`` assigned to this member."""
        for stream, ids in self.assignments:
            for pid in ids:
                yield stream, pid

    def owns(self, stream: str, partition: int) -> bool:
        return any(s == stream and partition in ids for s, ids in self.assignments)


class GroupRecord(msgspec.Struct, frozen=True):
    """A consumer group: its coordinator (a broker id), its epoch and its members, sorted by id."""

    id: str
    coordinator: str
    epoch: int
    members: tuple[GroupMember, ...]
    created_ns: int = 0

    def member(self, consumer_id: str) -> GroupMember | None:
        for m in self.members:
            if m.id == consumer_id:
                return m
        return None

    @property
    def member_ids(self) -> tuple[str, ...]:
        return tuple(m.id for m in self.members)

    def owner_of(self, stream: str, partition: int) -> str | None:
        """The member the partition is assigned to (None: nobody)."""
        for m in self.members:
            if m.owns(stream, partition):
                return m.id
        return None


def group_prefix(keys: Keys) -> bytes:
    """Where every group record lives."""
    return f"{keys.prefix}/groups/".encode()


def group_key(keys: Keys, group_id: str) -> bytes:
    return group_prefix(keys) + group_id.encode()


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(GroupRecord)


def encode_group(record: GroupRecord) -> bytes:
    return _encoder.encode(record)


def decode_group(data: bytes) -> GroupRecord:
    return _decoder.decode(data)


def check_id(kind: str, value: str) -> None:
    """Refuse a group or consumer id (``kind`` names which) that breaks the rules of the module docstring."""
    if not value:
        raise InvalidArgumentError(f"no {kind} provided: it must be 1 to {MAX_ID_LENGTH} characters")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgumentError(f"{kind} is {len(value)} characters long; at most {MAX_ID_LENGTH} are allowed")
    if "/" in value or not value.isprintable() or any(c.isspace() for c in value):
        raise InvalidArgumentError(f"{kind} {value!r} may not contain '/', whitespace or unprintable characters")


def count_coordinated(groups: Mapping[str, GroupRecord]) -> dict[str, int]:
    """How many groups each broker coordinates."""
    counts: dict[str, int] = {}
    for group in groups.values():
        counts[group.coordinator] = counts.get(group.coordinator, 0) + 1
    return counts
