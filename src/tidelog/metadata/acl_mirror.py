"""The broker's local mirror of the ACL entries (``{prefix}/acls/``), following etcd's watch.

Every broker reads the entries once at start and then follows the prefix's watch
(:mod:`~tidelog.metadata.prefix_follower`), so an entry added or removed with ``tidelog acl`` reaches every
broker as soon as etcd delivers the change (well within a second on a healthy cluster), through broken watches
and compactions. There is no policy file to diverge between servers.

**Failing closed.** A record that does not decode (written by a newer tidelog, by hand, or damaged) cannot be
known to be harmless: it might be a deny. While any is present, :attr:`AclMirror.broken` names their keys and the
authorizer denies every principal that is not a super user or a broker, until the record is removed or fixed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import msgspec

from tidelog.metadata.acl_records import AclEntry, acl_prefix, decode_acl
from tidelog.metadata.prefix_follower import PrefixFollower
from tidelog.metadata.records import Keys

log = logging.getLogger(__name__)


class AclMirror:
    """Follows the ACL records in etcd; :attr:`entries` and :attr:`broken` are the newest view."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self._prefix = acl_prefix(keys)
        self._entries: dict[bytes, AclEntry] = {}
        self._broken: set[bytes] = set()
        self._changed = asyncio.Condition()
        self.generation = 0  # one more at every change applied: the authorizer's cache key
        self._follower = PrefixFollower(client, self._prefix, name="acl-mirror", load=self._load, apply=self._apply)

    @property
    def entries(self) -> Mapping[bytes, AclEntry]:
        return MappingProxyType(self._entries)

    @property
    def broken(self) -> frozenset[bytes]:
        """Keys of records that do not decode: while any exists, only super users and brokers are allowed."""
        return frozenset(self._broken)

    @property
    def revision(self) -> int:
        return self._follower.revision

    async def start(self) -> None:
        await self._follower.start()

    async def stop(self) -> None:
        await self._follower.stop()

    async def wait_for(self, predicate: Callable[[AclMirror], bool], timeout: float | None = None) -> None:
        """Wait until ``predicate(self)`` holds."""

        async def wait() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: predicate(self))

        async with asyncio.timeout(timeout):
            await wait()

    async def _load(self, result: Any, again: bool) -> None:
        self._entries.clear()
        self._broken.clear()
        for kv in result:
            self._put(bytes(kv.key), bytes(kv.value))
        await self._changed_now()

    async def _apply(self, event: Any) -> None:
        key = bytes(event.kv.key)
        if event.kind == "DELETE":
            self._entries.pop(key, None)
            self._broken.discard(key)
        else:
            self._put(key, bytes(event.kv.value))
        await self._changed_now()

    async def _changed_now(self) -> None:
        self.generation += 1
        async with self._changed:
            self._changed.notify_all()

    def _put(self, key: bytes, value: bytes) -> None:
        try:
            entry = decode_acl(value)
        except (msgspec.MsgspecError, ValueError) as exc:
            self._entries.pop(key, None)
            self._broken.add(key)
            log.error(
                "ACL record %r does not decode (%s): every principal but super users and brokers is denied until "
                "it is removed (tidelog acl list shows it)",
                key,
                exc,
            )
            return
        self._broken.discard(key)
        self._entries[key] = entry
