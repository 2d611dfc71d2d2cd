"""The broker's local mirror of the consumer group records (``{prefix}/groups/``).

Kept apart from :class:`~tidelog.metadata.mirror.MetadataMirror` on purpose: group records change with every
join, leave and expiry, and none of that concerns the partition manager, so a group change never builds a new
snapshot of every stream and partition, nor wakes their listeners. Like the metadata mirror, it loads the prefix
once and then follows a watch from the next revision, so it sees every change once and in etcd's order, through
broken watches (:mod:`~tidelog.metadata.prefix_follower`).

``revision`` is the etcd revision of the newest change applied; ``wait_for`` lets a request wait until this
broker has seen a write made elsewhere (a join answered by the controller, then a fetch of assignments at the
coordinator).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any

from tidelog.metadata.group_records import GroupRecord, decode_group, group_prefix
from tidelog.metadata.prefix_follower import PrefixFollower
from tidelog.metadata.records import Keys

log = logging.getLogger(__name__)

GroupListener = Callable[[GroupRecord | None, GroupRecord | None], Awaitable[None]]
"""Called with a group's record before and after a change (None: absent)."""


class GroupMirror:
    """Follows the group records in etcd; ``groups`` is the newest view (read-only)."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self._client = client
        self._prefix = group_prefix(keys)
        self._groups: dict[str, GroupRecord] = {}
        self._view: Mapping[str, GroupRecord] = MappingProxyType(self._groups)
        self._listeners: list[GroupListener] = []
        self._changed = asyncio.Condition()
        self._follower = PrefixFollower(client, self._prefix, name="group-mirror", load=self._load, apply=self._apply)

    @property
    def groups(self) -> Mapping[str, GroupRecord]:
        return self._view

    def get(self, group_id: str) -> GroupRecord | None:
        return self._groups.get(group_id)

    def add_listener(self, listener: GroupListener) -> None:
        """Call ``listener(old, new)`` after every change of one group, in order, one at a time."""
        self._listeners.append(listener)

    @property
    def revision(self) -> int:
        """The etcd revision of the newest change seen."""
        return self._follower.revision

    async def start(self) -> None:
        await self._follower.start()

    async def stop(self) -> None:
        await self._follower.stop()

    async def wait_for(self, predicate: Callable[[GroupMirror], bool], timeout: float | None = None) -> None:
        """Wait until ``predicate(self)`` holds (and the listeners of the change that made it hold have run)."""

        async def wait() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: predicate(self))

        async with asyncio.timeout(timeout):
            await wait()

    async def _load(self, result: Any, again: bool) -> None:
        """Take a whole read of the prefix; on a re-read (the watch's history was compacted away), tell the
        listeners of every group that changed meanwhile."""
        old = dict(self._groups)
        self._groups.clear()
        for kv in result:
            self._put(kv.key, kv.value)
        if again:
            for group_id in sorted(old.keys() | self._groups.keys()):
                if old.get(group_id) != self._groups.get(group_id):
                    await self._changed_group(group_id, old.get(group_id))
            async with self._changed:
                self._changed.notify_all()

    async def _apply(self, event: Any) -> None:
        group_id = bytes(event.kv.key)[len(self._prefix) :].decode()
        old = self._groups.get(group_id)
        if event.kind == "DELETE":
            self._groups.pop(group_id, None)
        else:
            self._put(event.kv.key, event.kv.value)
        await self._changed_group(group_id, old)
        async with self._changed:
            self._changed.notify_all()

    async def _changed_group(self, group_id: str, old: GroupRecord | None) -> None:
        new = self._groups.get(group_id)
        for listener in self._listeners:
            try:
                await listener(old, new)
            except Exception:  # a listener's failure must not stop the mirror
                log.exception("group listener failed for %s", group_id)

    def _put(self, key: bytes, value: bytes) -> None:
        try:
            record = decode_group(bytes(value))
        except Exception:
            log.exception("ignoring an undecodable group record at %r", bytes(key))
            return
        self._groups[record.id] = record
