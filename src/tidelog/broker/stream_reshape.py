"""Reshaping streams that exist: more partitions, other settings, and the preferred leaders elected now.

As for :class:`~tidelog.broker.streams.StreamAdmin`, each operation validates its input, has the controller write
the change (fenced by its epoch: in process when this broker is the controller, forwarded over the wire protocol
otherwise), then waits until this broker's mirror has applied it.

**Adding partitions** (``tidelog stream add-partitions``) follows Liftbridge's subject rule: partition ``i > 0``
listens on ``subject.i``, so the new ones extend the stream's subjects and every old partition keeps its own.
A stream never shrinks: partitions hold data, and removing them would lose it. Internal streams cannot grow
(``__cursors`` finds a cursor's partition by hashing over its partition count).

**Changing settings** (``tidelog stream alter``) is allowed for the settings in :data:`LIVE_SETTINGS`: each
replica applies them as its broker's mirror delivers the new stream record (the partition manager reconfigures
the open log; auto-pause, tiering and concurrency control read the record). The settings in
:data:`FIXED_SETTINGS` are refused by name, with the reason: they decide how data already written is stored.
``segment_max_bytes`` may grow but not shrink: a follower copies batches as large as the old limit allowed, and
a smaller limit would refuse them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from tidelog.broker.controller_link import call_controller
from tidelog.broker.encryption import KeyVault
from tidelog.broker.streams import MAX_PARTITIONS, RESERVED_STREAMS, validate_config, validate_subject
from tidelog.metadata.mirror import MetadataMirror
from tidelog.metadata.placement import PendingPlacements, place_replicas, resolve_replication_factor
from tidelog.metadata.records import PartitionRecord, StreamConfig, StreamRecord
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.metadata.stream_changes import ChangeOutcome
from tidelog.protocol.errors import InvalidArgumentError, UnavailableError, UnknownStreamError
from tidelog.protocol.reshape_messages import (
    RESET,
    AddPartitionsRequest,
    AddPartitionsResponse,
    AlterStreamRequest,
    AlterStreamResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
    SettingChange,
)

if TYPE_CHECKING:
    from tidelog.broker.controller_link import ControllerLink

log = logging.getLogger(__name__)

LIVE_SETTINGS: Mapping[str, str] = {
    "retention_max_bytes": "the next cleaner pass",
    "retention_max_messages": "the next cleaner pass",
    "retention_max_age_ms": "the next cleaner pass",
    "cleaner_interval_ms": "the cleaner's next wake-up",
    "segment_max_bytes": "the next roll (it may grow, not shrink)",
    "segment_max_age_ms": "the next append",
    "compact_enabled": "the next cleaner pass (not on a stream that tiers)",
    "compact_max_goroutines": "the next compaction",
    "compact_min_lag_ms": "the next compaction",
    "auto_pause_time_ms": "the next auto-pause sweep",
    "auto_pause_disable_if_subscribers": "the next auto-pause sweep",
    "min_isr": "the leader's next commit (at most the replication factor)",
    "optimistic_concurrency_control": "the next publish",
    "unclean_leader_election": "the controller's next failover",
    "local_retention_ms": "the next tiering pass",
    "local_retention_bytes": "the next tiering pass",
}
"""The stream settings ``tidelog stream alter`` changes at run time, and when a replica follows the change."""

FIXED_SETTINGS: Mapping[str, str] = {
    "encryption": "data already written stays as it was sealed (or not); create a new stream to change it",
    "tiered": "it decides where sealed segments live; create a new stream to change it",
    "flush_policy": "it is fixed when a partition's log opens",
    "flush_interval_ms": "it is fixed when a partition's log opens",
}
"""The stream settings that cannot change at run time, each with the reason."""

_ATTEMPTS = 8  # compare-and-swap rounds before a change gives up as "kept changing"
_TIMEOUT = 10.0
_SECONDS_PER_PARTITION = 0.02  # opening each new local partition, as for a creation


class StreamReshape:
    """Adds partitions, changes settings and elects preferred leaders, through the controller."""

    def __init__(
        self,
        broker_id: str,
        store: Any,
        mirror: MetadataMirror,
        *,
        link: ControllerLink | None = None,
        vault: KeyVault | None = None,
        tiered_store: bool = False,
        segment_max_bytes: int = 128 * 1024 * 1024,
        placements: PendingPlacements | None = None,
    ) -> None:
        """``store``: the plain metadata store, written to when there is no ``link`` (tests, tools).
        ``tiered_store``: whether the brokers have a tiered store; ``segment_max_bytes``: the brokers' default,
        what a stream without its own value has. ``placements``: the placements not yet in the snapshot, shared
        with :class:`~tidelog.broker.streams.StreamAdmin` (``admin.placements``)."""
        self._broker_id = broker_id
        self._store = store
        self._mirror = mirror
        self._link = link
        self._vault = vault or KeyVault(None)
        self._tiered_store = tiered_store
        self._segment_default = segment_max_bytes
        self._placements = placements or PendingPlacements()

    # ---- add partitions ----

    async def add_partitions(self, name: str, to: int, *, forwarded: bool = False) -> AddPartitionsResponse:
        """Grow stream ``name`` to ``to`` partitions; the counts before and after."""
        stream = self._existing(name)
        if not 1 <= to <= MAX_PARTITIONS:
            raise InvalidArgumentError(f"partitions must be between 1 and {MAX_PARTITIONS}, got {to}")
        if to < stream.partitions:
            raise InvalidArgumentError(
                f"stream {name!r} has {stream.partitions} partitions and cannot shrink to {to}: partitions can "
                "only be added (removing one would lose its data)"
            )
        before = stream.partitions
        if to == before:
            return AddPartitionsResponse(before, before)
        validate_subject(stream.subject, to)
        timeout = _TIMEOUT + (to - before) * _SECONDS_PER_PARTITION
        writer = self._writer(forwarded)
        if writer is None:
            assert self._link is not None
            answer = await self._link.forward(AddPartitionsRequest(name, to, forwarded=True), timeout)
            await self._wait(lambda s: _grown(s, name, to), f"stream {name!r} to have {to} partitions", timeout)
            assert isinstance(answer, AddPartitionsResponse)
            return answer
        await self._mirror.with_registrations(_TIMEOUT)  # brokers registered a moment ago count for placement
        for _ in range(_ATTEMPTS):
            stream = self._existing(name)
            if stream.partitions >= to:  # another request grew it meanwhile
                return AddPartitionsResponse(before, stream.partitions)
            grown = msgspec.structs.replace(stream, partitions=to)
            parts = self._place(stream, to)
            with self._placements.hold(name, stream.partitions, [p.replicas for p in parts]):
                outcome = await call_controller(writer.add_partitions(stream, grown, parts))
                if outcome is ChangeOutcome.CHANGED:
                    await self._wait(lambda s: _grown(s, name, to), f"stream {name!r} to have {to} partitions", timeout)
            if outcome is ChangeOutcome.CHANGED:
                log.info("stream %s: %d → %d partitions", name, stream.partitions, to)
                return AddPartitionsResponse(before, to)
            await self._wait(_stream_changed(stream), "metadata to catch up")
        raise UnavailableError(f"stream {name!r} kept changing; try again")

    def _place(self, stream: StreamRecord, to: int) -> list[PartitionRecord]:
        """Records for partitions ``stream.partitions`` up to ``to - 1``, on the live brokers, least loaded first."""
        snap = self._mirror.snapshot
        brokers = sorted(snap.brokers) or [self._broker_id]
        rf = resolve_replication_factor(stream.replication_factor, len(brokers))
        load, leaders = self._placements.load(snap)
        racks = {b: r.rack for b, r in snap.brokers.items()}
        placed = place_replicas(brokers, to - stream.partitions, rf, load, leaders, racks)
        encrypted = bool(stream.config.encryption)
        return [
            PartitionRecord(
                stream.name,
                pid,
                replicas,
                replicas[0],
                replicas,
                data_keys=self._vault.first_keys(stream.name, pid) if encrypted else (),
            )
            for pid, replicas in enumerate(placed, start=stream.partitions)
        ]

    # ---- alter settings ----

    async def alter(self, name: str, changes: Mapping[str, Any], *, forwarded: bool = False) -> AlterStreamResponse:
        """Set stream ``name``'s settings in ``changes`` (field name → typed value, None for the broker default);
        the settings whose value changed."""
        stream = self._existing(name)
        self._check_names(changes)
        writer = self._writer(forwarded)
        if writer is None:
            assert self._link is not None
            self._changed_config(stream, changes)  # refused here already when it cannot be done
            request = AlterStreamRequest(name, _as_strings(changes), forwarded=True)
            answer = await self._link.forward(request, _TIMEOUT)
            await self._wait(lambda s: _has_settings(s, name, changes), f"stream {name!r} to change")
            assert isinstance(answer, AlterStreamResponse)
            return answer
        await self._mirror.with_registrations(_TIMEOUT)  # brokers registered a moment ago count for placement
        for _ in range(_ATTEMPTS):
            stream = self._existing(name)
            config = self._changed_config(stream, changes)
            if config == stream.config:
                return AlterStreamResponse(())
            new = msgspec.structs.replace(stream, config=config)
            outcome = await call_controller(writer.alter_stream(stream, new))
            if outcome is ChangeOutcome.CHANGED:
                await self._wait(_stream_is(new), f"stream {name!r} to change")
                report = _report(stream.config, config)
                log.info("stream %s: %s", name, ", ".join(f"{c.name} {c.before!r}→{c.after!r}" for c in report))
                return AlterStreamResponse(report)
            await self._wait(_stream_changed(stream), "metadata to catch up")
        raise UnavailableError(f"stream {name!r} kept changing; try again")

    def _check_names(self, changes: Mapping[str, Any]) -> None:
        if not changes:
            raise InvalidArgumentError(f"no setting to change; settings that change at run time: {_live_names()}")
        unknown = sorted(set(changes) - set(StreamConfig.__struct_fields__))
        if unknown:
            raise InvalidArgumentError(
                f"unknown stream setting {', '.join(unknown)}; settings that change at run time: {_live_names()}"
            )

    def _changed_config(self, stream: StreamRecord, changes: Mapping[str, Any]) -> StreamConfig:
        """``stream``'s settings with ``changes`` applied, or InvalidArgumentError saying why they cannot be."""
        old = stream.config
        fixed = [k for k in changes if k in FIXED_SETTINGS and changes[k] != getattr(old, k)]
        if fixed:
            reasons = "; ".join(f"{k}: {FIXED_SETTINGS[k]}" for k in sorted(fixed))
            raise InvalidArgumentError(
                f"stream {stream.name!r}: {', '.join(sorted(fixed))} cannot change at run time ({reasons}). "
                f"Settings that can: {_live_names()}"
            )
        try:
            new = msgspec.structs.replace(old, **changes)
            new = msgspec.convert(msgspec.to_builtins(new), StreamConfig)  # the types checked, as on creation
        except (TypeError, msgspec.ValidationError) as exc:
            raise InvalidArgumentError(f"bad stream setting: {exc}") from None
        validate_config(new)
        if new.min_isr is not None and new.min_isr > stream.replication_factor:
            raise InvalidArgumentError(
                f"min_isr {new.min_isr} is above stream {stream.name!r}'s replication factor "
                f"{stream.replication_factor}"
            )
        before = old.segment_max_bytes or self._segment_default
        after = new.segment_max_bytes or self._segment_default
        if after < before:
            raise InvalidArgumentError(
                f"segment_max_bytes can grow but not shrink at run time ({before} now, asked for {after}): "
                "followers still copy batches as large as the current limit allows"
            )
        if new.compact_enabled != old.compact_enabled and self._tiered_store and new.tiered is not False:
            raise InvalidArgumentError(
                f"compact_enabled cannot change on stream {stream.name!r}: it tiers (the brokers have a tiered "
                "store and its tiered setting is not false), and a compacted stream cannot tier"
            )
        return new

    # ---- preferred leaders ----

    async def elect_leaders(self, *, forwarded: bool = False) -> ElectLeadersResponse:
        """Move leaderships to the preferred replicas now (Kafka's preferred-leader election)."""
        if self._link is None:
            raise UnavailableError("this broker runs without a controller: there is no one to elect leaders")
        if not self._link.is_local:
            if forwarded:
                raise UnavailableError(f"broker {self._broker_id} is not the controller")
            answer = await self._link.forward(ElectLeadersRequest(forwarded=True), _TIMEOUT)
            assert isinstance(answer, ElectLeadersResponse)
            return answer
        controller = self._link.controller
        moved = await call_controller(controller.balance_now())
        partitions = self._mirror.snapshot.partitions.values()
        elsewhere = sum(1 for p in partitions if p.replicas and p.leader != p.replicas[0])
        return ElectLeadersResponse(moved, max(0, elsewhere - moved))

    # ---- common ----

    def _existing(self, name: str) -> StreamRecord:
        stream = self._mirror.snapshot.stream(name)
        if stream is None:
            raise UnknownStreamError(f"no stream named {name!r}")
        if name in RESERVED_STREAMS:
            raise InvalidArgumentError(f"stream {name!r} is reserved for tidelog's own use and cannot be reshaped")
        return stream

    def _writer(self, forwarded: bool) -> Any:
        """The local controller (or the plain store when there is no election), or None to forward."""
        if self._link is None:
            return self._store
        if self._link.is_local:
            return self._link.controller
        if forwarded:
            raise UnavailableError(
                f"broker {self._broker_id} is not the controller (the controller is {self._link.controller_id})"
            )
        return None

    async def _wait(
        self, predicate: Callable[[MetadataSnapshot], bool], what: str, timeout: float = _TIMEOUT
    ) -> MetadataSnapshot:
        try:
            return await self._mirror.wait_for(predicate, timeout)
        except TimeoutError:
            raise UnavailableError(f"timed out waiting for {what}") from None


def _stream_changed(seen: StreamRecord) -> Callable[[MetadataSnapshot], bool]:
    return lambda snap: snap.stream(seen.name) != seen


def _stream_is(wanted: StreamRecord) -> Callable[[MetadataSnapshot], bool]:
    return lambda snap: snap.stream(wanted.name) == wanted


def _grown(snap: MetadataSnapshot, name: str, to: int) -> bool:
    stream = snap.stream(name)
    return stream is None or (stream.partitions >= to and len(snap.partitions_of(name)) == stream.partitions)


def _has_settings(snap: MetadataSnapshot, name: str, changes: Mapping[str, Any]) -> bool:
    stream = snap.stream(name)
    return stream is None or all(getattr(stream.config, k) == v for k, v in changes.items())


def _live_names() -> str:
    return ", ".join(sorted(LIVE_SETTINGS))


def _as_strings(changes: Mapping[str, Any]) -> dict[str, str]:
    """``changes`` as the wire carries them (:data:`~tidelog.protocol.reshape_messages.RESET` for None)."""
    return {k: RESET if v is None else _text(v) for k, v in changes.items()}


def _text(value: object) -> str:
    return "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _report(old: StreamConfig, new: StreamConfig) -> tuple[SettingChange, ...]:
    return tuple(
        SettingChange(k, _text(getattr(old, k)), _text(getattr(new, k)))
        for k in StreamConfig.__struct_fields__
        if getattr(old, k) != getattr(new, k)
    )
