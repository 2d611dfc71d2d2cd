"""The controller's side of consumer groups: every write of a group record, and coordinator failover.

Only the controller changes group records, each change one etcd transaction fenced by the controller epoch
(:class:`~tidelog.metadata.fenced_writer.FencedWriter`, from the election's current term), so a deposed controller
can never write one. Each change reads the record (and the etcd revision) straight from etcd, decides the new
record with :mod:`tidelog.broker.groups.decisions`, and writes it only if the key still has the revision it read
(a compare-and-swap on ``mod_revision``, 0 meaning absent): two changes of one group never overwrite each other,
and the loser decides again on the winner's record.

Requests (from :class:`~tidelog.broker.groups.service.GroupService`, on this broker or forwarded from another):
:meth:`GroupMembership.join`, :meth:`GroupMembership.leave` (also a coordinator removing a member that stopped
heartbeating) and :meth:`GroupMembership.report` (a member saying the coordinator does not answer). Reports are
counted in memory per group, coordinator and epoch; once more than half of the group's members reported within
``coordinator_timeout`` of each other's reports (Liftbridge's rule), another live broker becomes the
coordinator. Reports are forgotten when this broker stops being the controller: the members report again.

Without any request, :meth:`GroupMembership.run` (a task for the broker's lifetime, acting only while this broker
is the controller) fixes what :func:`~tidelog.broker.groups.decisions.decide_reconcile` finds: groups whose
coordinator's broker is gone (its registration lapsed or was revoked) get another coordinator at once, groups
consuming deleted streams are rebalanced. It wakes on every change of brokers, streams or groups, and once a
second (so that a broker just elected controller looks without waiting for a change).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tidelog.broker.groups.decisions import (
    decide_join,
    decide_leave,
    decide_new_coordinator,
    decide_reconcile,
)
from tidelog.clock import Clock, SystemClock
from tidelog.metadata.controller_election import ControllerElection
from tidelog.metadata.fenced_writer import ControllerFencedError
from tidelog.metadata.group_mirror import GroupMirror
from tidelog.metadata.group_records import GroupRecord, decode_group, encode_group, group_key
from tidelog.metadata.mirror import MetadataMirror
from tidelog.metadata.records import Keys, decode_stream
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.protocol.errors import GroupRefusedError, UnavailableError, UnknownMemberError

log = logging.getLogger(__name__)

_ATTEMPTS = 8  # compare-and-swap rounds before a group change gives up (only lost races cost a round)
_TICK = 1.0  # seconds between looks of the reconcile task when nothing changed
_SEEN_WAIT = 5.0  # seconds a change waits for this broker's group mirror to show it before answering anyway

Decide = Callable[[GroupRecord | None, int], GroupRecord | None]
"""``(record in etcd or None, epoch for the new record) -> record to write (None: delete)``."""


@dataclass(slots=True)
class _Failover:
    """Reports of one group's coordinator at one epoch: who reported, and until when the reports count."""

    coordinator: str
    epoch: int
    witnesses: set[str] = field(default_factory=set)
    expires_ns: int = 0


class GroupMembership:
    """Writes group records for the controller; see the module docstring."""

    def __init__(
        self,
        client: Any,
        keys: Keys,
        election: ControllerElection,
        mirror: MetadataMirror,
        groups: GroupMirror,
        *,
        coordinator_timeout: float,
        clock: Clock | None = None,
    ) -> None:
        self._client = client
        self._keys = keys
        self._election = election
        self._mirror = mirror
        self._groups = groups
        self._coordinator_timeout = coordinator_timeout
        self._clock = clock or SystemClock()
        self._failovers: dict[str, _Failover] = {}
        self._dirty = asyncio.Event()
        mirror.add_listener(self._on_metadata)
        groups.add_listener(self._on_group)

    @property
    def active(self) -> bool:
        """Whether this broker is the controller (its writes are fenced whatever this says)."""
        return self._election.is_controller

    # ---- requests ----

    async def join(self, group_id: str, consumer_id: str, streams: tuple[str, ...]) -> GroupRecord:
        """Add ``consumer_id`` to the group (created if needed); the record as written."""
        counts = await self._partition_counts(streams)
        snap = self._mirror.snapshot

        def decide(record: GroupRecord | None, epoch: int) -> GroupRecord:
            return decide_join(
                record, group_id, consumer_id, streams, counts, snap.brokers.keys(), self._groups.groups, epoch,
                self._clock.now_ns(),
            )  # fmt: skip

        written = await self._change(group_id, decide)
        assert written is not None
        log.info("group %s: consumer %s joined (epoch %d, coordinator %s)", group_id, consumer_id, written.epoch,
                 written.coordinator)  # fmt: skip
        return written

    async def leave(self, group_id: str, consumer_id: str, *, expired: bool = False) -> GroupRecord | None:
        """Remove ``consumer_id`` from the group; the record as written (None: the group is gone)."""
        counts = await self._partition_counts(self._consumed())

        def decide(record: GroupRecord | None, epoch: int) -> GroupRecord | None:
            return decide_leave(record, group_id, consumer_id, counts, epoch)

        written = await self._change(group_id, decide)
        why = "timed out" if expired else "left"
        log.info("group %s: consumer %s %s (epoch %s)", group_id, consumer_id, why,
                 written.epoch if written else "-, group deleted")  # fmt: skip
        return written

    async def report(self, group_id: str, consumer_id: str, coordinator: str, epoch: int) -> None:
        """A member reports that ``coordinator`` (of group ``epoch``) does not answer; fail it over on a majority."""
        record = (await self._read(group_id))[0]
        if record is None:
            raise GroupRefusedError(f"no such consumer group {group_id}")
        if record.coordinator != coordinator or record.epoch != epoch:
            raise GroupRefusedError(
                f"coordinator generation mismatch for consumer group {group_id}: current coordinator "
                f"{record.coordinator} epoch {record.epoch}, reported coordinator {coordinator} epoch {epoch}"
            )
        if record.member(consumer_id) is None:
            raise UnknownMemberError(f"consumer {consumer_id} is not a member of consumer group {group_id}")
        now = self._clock.monotonic_ns()
        failover = self._failovers.get(group_id)
        stale = failover is None or now > failover.expires_ns
        if failover is None or stale or (failover.coordinator, failover.epoch) != (coordinator, epoch):
            failover = self._failovers[group_id] = _Failover(coordinator, epoch)
        failover.witnesses.add(consumer_id)
        failover.expires_ns = now + int(self._coordinator_timeout * 1e9)
        if len(failover.witnesses) <= len(record.members) // 2:
            return
        self._failovers.pop(group_id, None)
        live = self._mirror.snapshot.brokers.keys()

        def decide(current: GroupRecord | None, new_epoch: int) -> GroupRecord | None:
            if current is None or (current.coordinator, current.epoch) != (coordinator, epoch):
                return current  # changed meanwhile: nothing to fail over
            return decide_new_coordinator(current, live, self._groups.groups, new_epoch)

        written = await self._change(group_id, decide)
        if written is not None and written.coordinator != coordinator:
            log.warning("group %s: coordinator %s reported by %d of %d members; %s coordinates it now (epoch %d)",
                        group_id, coordinator, len(failover.witnesses), len(record.members), written.coordinator,
                        written.epoch)  # fmt: skip

    # ---- the reconcile task ----

    async def run(self) -> None:
        """Fix groups by themselves while this broker is the controller (module docstring); runs until cancelled.

        The groups are looked at after a change of brokers, streams or groups, and once when this broker becomes
        the controller; the tick only notices that (and retries a failed pass), so an idle cluster costs nothing.
        """
        was_active = False
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_TICK):
                    await self._dirty.wait()
            active = self.active
            if not active:
                self._dirty.clear()  # the controller looks when it is elected
                self._failovers.clear()
            elif self._dirty.is_set() or not was_active:
                self._dirty.clear()
                try:
                    await self._reconcile_all()
                except ControllerFencedError:
                    pass  # the term is over: the next controller looks again
                except Exception as error:
                    log.warning("group reconcile failed (%s); trying again in %.1fs", error, _TICK)
                    await self._clock.sleep(_TICK)
                    self._dirty.set()
            was_active = active

    async def _reconcile_all(self) -> None:
        snap = self._mirror.snapshot
        counts = await self._partition_counts(self._consumed())
        live = snap.brokers.keys()
        for group_id, record in list(self._groups.groups.items()):
            if decide_reconcile(record, counts, live, self._groups.groups, record.epoch) is None:
                continue

            def decide(current: GroupRecord | None, epoch: int) -> GroupRecord | None:
                if current is None:
                    return None
                return decide_reconcile(current, counts, live, self._groups.groups, epoch) or current

            written = await self._change(group_id, decide)
            if written is not None:
                log.info("group %s: coordinator %s, epoch %d after %s", group_id, written.coordinator,
                         written.epoch, "a broker left" if written.coordinator != record.coordinator
                         else "a stream changed")  # fmt: skip

    async def _on_metadata(self, old: MetadataSnapshot, new: MetadataSnapshot) -> None:
        change = new.change  # the mirror names what changed: no comparison of every stream
        if change is None:
            came_or_went = old.brokers.keys() != new.brokers.keys() or old.streams.keys() != new.streams.keys()
        else:
            came_or_went = any((k in old.brokers) != (k in new.brokers) for k in change.brokers) or any(
                (k in old.streams) != (k in new.streams) for k in change.streams
            )
        if came_or_went:
            self._dirty.set()

    async def _on_group(self, _old: GroupRecord | None, _new: GroupRecord | None) -> None:
        self._dirty.set()

    # ---- etcd ----

    async def _read(self, group_id: str) -> tuple[GroupRecord | None, int, int]:
        """The record in etcd, its key's ``mod_revision`` (0: absent) and etcd's revision at the read."""
        key = group_key(self._keys, group_id)
        found = await self._client.get_range(key, key + b"\0")
        revision = int(found.header.revision)
        for kv in found:
            if bytes(kv.key) == key:
                return decode_group(bytes(kv.value)), int(kv.mod_revision), revision
        return None, 0, revision

    async def _change(self, group_id: str, decide: Decide) -> GroupRecord | None:
        """Read, decide, compare-and-swap, until it lands; the record written (None: deleted, or absent)."""
        key = group_key(self._keys, group_id)
        tx = self._client.transactions
        for _ in range(_ATTEMPTS):
            record, mod, revision = await self._read(group_id)
            new = decide(record, revision + 1)
            if new == record:
                return record
            writer = self._election.writer()  # NotControllerError when the term ended: the caller forwards again
            operation = tx.delete(key) if new is None else tx.put(key, encode_group(new))
            result = await writer.transaction(compare=[tx.mod(key) == mod], success=[operation])
            if result.committed:
                await self._seen(revision + 1)
                return new
        raise UnavailableError(f"consumer group {group_id} kept changing ({_ATTEMPTS} attempts); try again")

    async def _seen(self, revision: int) -> None:
        """Wait until this broker's group mirror has applied ``revision`` (a write just made), so that what the
        requester does next on this broker sees it. The write has landed either way: a mirror that lags longer
        only makes that later request wait for it (:data:`~tidelog.broker.groups.coordinator.CATCH_UP`)."""
        with contextlib.suppress(TimeoutError):
            await self._groups.wait_for(lambda g: g.revision >= revision, timeout=_SEEN_WAIT)

    def _consumed(self) -> tuple[str, ...]:
        """Every stream some group consumes."""
        return tuple(sorted({s for g in self._groups.groups.values() for m in g.members for s in m.streams}))

    async def _partition_counts(self, streams: tuple[str, ...]) -> dict[str, int]:
        """Partition counts of every known stream; a stream named in ``streams`` that this broker's mirror has
        not seen yet (created a moment ago) is looked up in etcd itself before it counts as missing, so that a
        mirror lagging a creation never makes a join refuse the stream or a rebalance drop it."""
        counts = _counts(self._mirror.snapshot)
        for name in streams:
            if name not in counts:
                found = await self._client.get(self._keys.stream(name))
                if found is not None:
                    counts[name] = decode_stream(bytes(found.value)).partitions
        return counts


def _counts(snap: MetadataSnapshot) -> dict[str, int]:
    streams: Mapping[str, Any] = snap.streams
    return {name: record.partitions for name, record in streams.items()}
