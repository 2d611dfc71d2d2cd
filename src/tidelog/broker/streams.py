"""Stream administration: create, delete, pause, resume and set read-only, with input validation.

Each operation validates its input, has the controller write the metadata (a guarded etcd transaction fenced
by the controller epoch: in process when this broker is the controller, forwarded over the wire protocol
otherwise), then waits until this broker's mirror has applied it (and the partition manager has acted on it),
so a client that creates a stream can publish to it and subscribe to it as soon as the call returns, whichever
broker it asked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import msgspec

from tidelog.broker.controller_link import call_controller
from tidelog.broker.encryption import KeyVault
from tidelog.clock import Clock, SystemClock
from tidelog.metadata.activity import ACTIVITY_STREAM
from tidelog.metadata.mirror import MetadataMirror
from tidelog.metadata.placement import PendingPlacements, place_replicas, resolve_replication_factor
from tidelog.metadata.records import STREAM_NAME_RE, PartitionRecord, StreamConfig, StreamRecord
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.metadata.store import CreateOutcome
from tidelog.metadata.stream_creation import differences
from tidelog.protocol.cursors import CURSORS_STREAM
from tidelog.protocol.errors import (
    InvalidArgumentError,
    StreamExistsError,
    UnavailableError,
    UnknownPartitionError,
    UnknownStreamError,
)
from tidelog.protocol.messages import CreateStreamRequest, DeleteStreamRequest, SetStreamStateRequest
from tidelog.protocol.subjects import check_queue_group, check_subject, quote, subject_problem
from tidelog.storage.config import MAX_COMPACT_WORKERS

if TYPE_CHECKING:
    from tidelog.broker.controller_link import ControllerLink

log = logging.getLogger(__name__)

MAX_PARTITIONS = 10_000
RESERVED_STREAMS = frozenset({CURSORS_STREAM, ACTIVITY_STREAM})
"""Internal streams (:mod:`tidelog.broker.cursor_stream`, :mod:`tidelog.broker.activity_stream`): clients can
neither create nor delete them."""
_APPLY_TIMEOUT = 10.0
_APPLY_SECONDS_PER_PARTITION = 0.02
"""Creating or deleting a stream opens or closes every local partition of it before the request is answered: the
wait allows for that on top of ``_APPLY_TIMEOUT`` (10,000 partitions: 210 s)."""


def _apply_timeout(partitions: int) -> float:
    return _APPLY_TIMEOUT + partitions * _APPLY_SECONDS_PER_PARTITION


_CAS_ATTEMPTS = 8


def validate_subject(subject: str, partitions: int = 1) -> None:
    """NATS subject rules (:mod:`tidelog.protocol.subjects`: wildcards as whole tokens, the length limit) for a stream's
    subject and for those of its partitions: partition ``i > 0`` listens on ``subject.i``, which must be valid too
    (so ``>`` cannot end the subject of a stream with several partitions, and the suffix counts to the limit)."""
    check_subject(subject, "subject", wildcards=True)
    if partitions > 1:
        last = f"{subject}.{partitions - 1}"
        problem = subject_problem(last, wildcards=True)
        if problem is not None:
            raise InvalidArgumentError(
                f"subject {quote(subject)} cannot have {partitions} partitions: partition {partitions - 1} would "
                f"listen on {quote(last)}, which {problem}"
            )


def validate_stream_name(name: str) -> None:
    if not STREAM_NAME_RE.match(name):
        raise InvalidArgumentError(f"invalid stream name {quote(name)}: use 1-249 letters, digits, '_', '-' or '.'")


def validate_config(config: StreamConfig) -> None:
    """Durations and sizes must be positive where set; the flush policy one of the three."""
    for name in config.__struct_fields__:
        value = getattr(config, name)
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            raise InvalidArgumentError(f"{name} must not be negative, got {value}")
    if config.segment_max_bytes is not None and config.segment_max_bytes < 1024:
        raise InvalidArgumentError(f"segment_max_bytes must be at least 1024, got {config.segment_max_bytes}")
    if config.flush_policy is not None and config.flush_policy not in ("always", "interval", "never"):
        raise InvalidArgumentError(f"flush_policy must be 'always', 'interval' or 'never', got {config.flush_policy!r}")
    if config.cleaner_interval_ms is not None and config.cleaner_interval_ms < 1:
        raise InvalidArgumentError(f"cleanerInterval must be at least 1 ms, got {config.cleaner_interval_ms}")
    if config.tiered and config.compact_enabled:
        raise InvalidArgumentError(
            "a compacted stream cannot tier: compaction rewrites sealed segments that the tiered store keeps "
            "unchanged; set tiered=false or compact_enabled=false"
        )
    workers = config.compact_max_goroutines
    if workers is not None and not 1 <= workers <= MAX_COMPACT_WORKERS:
        raise InvalidArgumentError(
            f"compactMaxGoroutines must be between 1 and {MAX_COMPACT_WORKERS} (compaction worker threads), "
            f"got {workers}"
        )


class MetadataWriter(Protocol):
    """Guarded metadata writes: :class:`~tidelog.metadata.store.MetadataStore` (unfenced, for tests and tools)
    or the controller (fenced by its epoch)."""

    async def create_stream(self, stream: StreamRecord, partitions: Sequence[PartitionRecord]) -> CreateOutcome: ...

    async def delete_stream(self, name: str) -> bool: ...

    async def update_partition(self, old: PartitionRecord, new: PartitionRecord) -> bool: ...


def config_strings(config: StreamConfig) -> dict[str, str]:
    """A :class:`StreamConfig`'s settings as the wire protocol carries them (by name, as strings)."""
    out: dict[str, str] = {}
    for name in config.__struct_fields__:
        value = getattr(config, name)
        if value is not None:
            out[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


class StreamAdmin:
    """Validated metadata changes for streams and their partitions."""

    def __init__(
        self,
        broker_id: str,
        store: MetadataWriter,
        mirror: MetadataMirror,
        *,
        link: ControllerLink | None = None,
        clock: Clock | None = None,
        vault: KeyVault | None = None,
        default_encryption: bool = False,
        tiered_store: bool = False,
    ) -> None:
        """``tiered_store``: whether this broker has a tiered store (a stream asking to tier is refused without).
        ``clock``: the creation and change times written into stream records. ``vault``: makes the data keys
        of encrypted streams (:mod:`tidelog.broker.encryption`); ``default_encryption``: whether a stream whose
        request leaves ``encryption`` unset is encrypted (resolved by the controller, once, when it creates the
        stream, and stored in the stream's settings)."""
        self._broker_id = broker_id
        self._vault = vault or KeyVault(None)
        self._default_encryption = default_encryption
        self._tiered_store = tiered_store
        self._clock: Clock = clock or SystemClock()
        self._store = store
        self._mirror = mirror
        self._link = link
        self.placements = PendingPlacements()  # decided, not yet in the snapshot (shared with StreamReshape)

    def _writer(self, forwarded: bool) -> MetadataWriter | None:
        """Who writes here: the local controller (or the plain store when there is no election), or None when
        the request must be forwarded to the controller."""
        if self._link is None:
            return self._store
        if self._link.is_local:
            writer: MetadataWriter = self._link.controller
            return writer
        if forwarded:
            raise UnavailableError(
                f"broker {self._broker_id} is not the controller (the controller is {self._link.controller_id})"
            )
        return None

    async def create_stream(
        self,
        *,
        name: str,
        subject: str,
        group: str = "",
        partitions: int = 1,
        replication_factor: int = 1,
        config: StreamConfig | None = None,
        forwarded: bool = False,
        internal: bool = False,
        exists_ok: bool = True,
    ) -> StreamRecord:
        """Create a stream. Creating the same stream again (same subject, partitions, replication factor, group
        and settings) succeeds and changes nothing, unless ``exists_ok`` is false (Liftbridge's CreateStream:
        ALREADY_EXISTS whenever the name is taken); one that differs raises ``StreamExistsError`` naming what.
        ``internal``: the broker itself creates one of :data:`RESERVED_STREAMS`."""
        validate_stream_name(name)
        if name in RESERVED_STREAMS and not internal:
            raise InvalidArgumentError(f"stream name {name!r} is reserved for tidelog's own use")
        if partitions == 0:
            partitions = 1
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidArgumentError(f"partitions must be between 1 and {MAX_PARTITIONS}, got {partitions}")
        validate_subject(subject, partitions)
        check_queue_group(group)
        config = config or StreamConfig()
        validate_config(config)
        if config.tiered and not self._tiered_store:
            raise InvalidArgumentError(
                "tiered=true needs a tiered store, and this broker has none (its tiered_store setting is unset)"
            )
        if not exists_ok and self._mirror.snapshot.stream(name) is not None:
            raise StreamExistsError(f"stream {name!r} already exists")
        writer = self._writer(forwarded)
        if writer is None:
            assert self._link is not None
            request = CreateStreamRequest(
                name, subject, partitions, replication_factor, group, config_strings(config), forwarded=True
            )
            await self._link.forward(request, _apply_timeout(partitions))
            snap = await self._wait(
                lambda s: _stream_ready(s, name), f"stream {name!r} to be created", _apply_timeout(partitions)
            )
            return snap.streams[name]
        snap = await self._mirror.with_registrations(_APPLY_TIMEOUT)  # brokers registered a moment ago count
        brokers = sorted(snap.brokers) or [self._broker_id]
        rf = resolve_replication_factor(replication_factor, len(brokers))
        if config.min_isr is not None and config.min_isr > rf:
            raise InvalidArgumentError(f"minIsr {config.min_isr} is above the replication factor {rf}")
        load, leaders = self.placements.load(snap)
        racks = {b: r.rack for b, r in snap.brokers.items()}
        if config.encryption is None:
            config = msgspec.structs.replace(config, encryption=self._default_encryption and not internal)
        record = StreamRecord(name, subject, group, partitions, rf, self._clock.now_ns(), config)
        existing = snap.stream(name)
        keys = config.encryption and (existing is None or existing.config != config)  # no keys for a repeat
        placed = place_replicas(brokers, partitions, rf, load, leaders, racks)
        parts = [
            PartitionRecord(
                name, i, replicas, replicas[0], replicas, data_keys=self._vault.first_keys(name, i) if keys else ()
            )
            for i, replicas in enumerate(placed)
        ]
        with self.placements.hold(name, 0, placed):
            outcome = await call_controller(writer.create_stream(record, parts))
            if outcome is CreateOutcome.IN_PROGRESS:
                raise UnavailableError(f"stream {name!r} is being created by another request; retry")
            snap = await self._wait(
                lambda s: _stream_ready(s, name), f"stream {name!r} to be created", _apply_timeout(partitions)
            )
        created = snap.streams[name]
        if outcome is CreateOutcome.CONFLICT:
            differing = "; ".join(differences(created, record)) or "settings changed while it was created"
            raise StreamExistsError(
                f"stream {name!r} already exists with other settings: {differing}. Creating an existing stream "
                "succeeds only with the same settings; delete it first to change them"
            )
        if outcome is CreateOutcome.SAME_EXISTS and not exists_ok:
            raise StreamExistsError(f"stream {name!r} already exists")
        if outcome is CreateOutcome.CREATED:
            log.info("created stream %s on %r with %d partition(s)", name, subject, partitions)
        return created

    async def delete_stream(self, name: str, *, forwarded: bool = False) -> None:
        if name in RESERVED_STREAMS:
            raise InvalidArgumentError(f"stream {name!r} is reserved for tidelog's own use and cannot be deleted")
        writer = self._writer(forwarded)
        known = self._mirror.snapshot.stream(name)
        timeout = _apply_timeout(known.partitions if known is not None else 0)
        if writer is None:
            assert self._link is not None
            if known is None:
                raise UnknownStreamError(f"no stream named {name!r}")
            await self._link.forward(DeleteStreamRequest(name, forwarded=True), timeout)
        elif not await call_controller(writer.delete_stream(name)):
            raise UnknownStreamError(f"no stream named {name!r}")
        await self._wait(
            lambda s: name not in s.streams and not any(k[0] == name for k in s.partitions),
            f"stream {name!r} to go",
            timeout,
        )
        log.info("deleted stream %s", name)

    async def set_paused(
        self,
        name: str,
        partitions: Sequence[int],
        paused: bool,
        *,
        resume_all: bool = False,
        forwarded: bool = False,
    ) -> None:
        """Pause (or resume) the given partitions, all of them when ``partitions`` is empty.

        ``resume_all`` (Liftbridge's ``resumeAll``): a write to any of these partitions will resume every paused
        partition of the stream, not only the one written to.
        """
        if self._writer(forwarded) is None:
            request = SetStreamStateRequest(
                name, tuple(partitions), paused=paused, forwarded=True, resume_all=resume_all
            )
            await self._forward_update(request, name, partitions, lambda p: p.paused == paused)
            return
        now = self._clock.now_ns()

        def change(p: PartitionRecord) -> PartitionRecord:
            if p.paused == paused and p.resume_all == (resume_all and paused):
                return p  # already so (a resume racing another resume): nothing to write
            return msgspec.structs.replace(
                p,
                paused=paused,
                paused_ns=now if paused else p.paused_ns,
                resumed_ns=p.resumed_ns if paused else now,
                resume_all=resume_all and paused,
            )

        await self._update(name, partitions, change)

    async def set_readonly(
        self, name: str, partitions: Sequence[int], readonly: bool, *, forwarded: bool = False
    ) -> None:
        if self._writer(forwarded) is None:
            request = SetStreamStateRequest(name, tuple(partitions), readonly=readonly, forwarded=True)
            await self._forward_update(request, name, partitions, lambda p: p.readonly == readonly)
            return
        now = self._clock.now_ns()
        await self._update(name, partitions, lambda p: msgspec.structs.replace(p, readonly=readonly, readonly_ns=now))

    async def rotate_key(self, name: str, *, forwarded: bool = False) -> None:
        """Give every partition of encrypted stream ``name`` a new data key: new batches are sealed with it, the
        older keys stay to open what they sealed (``tidelog stream rotate-key``)."""
        stream = self._mirror.snapshot.stream(name)
        if stream is None:
            raise UnknownStreamError(f"no stream named {name!r}")
        if not stream.config.encryption:
            raise InvalidArgumentError(f"stream {name!r} is not encrypted: it has no data key to rotate")
        before = {p.id: len(p.data_keys) for p in self._mirror.snapshot.partitions_of(name)}
        if self._writer(forwarded) is None:
            request = SetStreamStateRequest(name, (), forwarded=True, rotate_key=True)
            await self._forward_update(request, name, (), lambda p: len(p.data_keys) > before.get(p.id, 0))
            return
        await self._update(
            name,
            (),
            lambda p: (
                msgspec.structs.replace(
                    p, data_keys=(*p.data_keys, self._vault.new_data_key(name, p.id, len(p.data_keys)))
                )
                if len(p.data_keys) <= before.get(p.id, 0)
                else p
            ),
        )

    def _partition_ids(self, name: str, partitions: Sequence[int]) -> list[int]:
        stream = self._mirror.snapshot.stream(name)
        if stream is None:
            raise UnknownStreamError(f"no stream named {name!r}")
        ids = list(partitions) or list(range(stream.partitions))
        for pid in ids:
            if not 0 <= pid < stream.partitions:
                raise UnknownPartitionError(f"stream {name!r} has partitions 0..{stream.partitions - 1}, not {pid}")
        return ids

    async def _forward_update(
        self,
        request: SetStreamStateRequest,
        name: str,
        partitions: Sequence[int],
        applied: Callable[[PartitionRecord], bool],
    ) -> None:
        """Have the controller make a partition change, then wait until this broker's mirror shows it."""
        assert self._link is not None
        ids = self._partition_ids(name, partitions)
        timeout = _apply_timeout(len(ids))  # the controller writes one partition per transaction
        await self._link.forward(request, timeout)

        def done(snap: MetadataSnapshot) -> bool:
            records = [snap.partition(name, pid) for pid in ids]
            return all(r is None or applied(r) for r in records)

        await self._wait(done, f"{name} to update", timeout)

    async def _update(
        self, name: str, partitions: Sequence[int], change: Callable[[PartitionRecord], PartitionRecord]
    ) -> None:
        ids = self._partition_ids(name, partitions)
        writer = self._writer(True)
        assert writer is not None
        for pid in ids:
            for _ in range(_CAS_ATTEMPTS):
                current = self._mirror.snapshot.partition(name, pid)
                if current is None:
                    raise UnknownStreamError(f"stream {name!r} was deleted")
                wanted = change(current)
                if wanted == current or await call_controller(writer.update_partition(current, wanted)):
                    break
                await self._wait(_changed_from(name, pid, current), "metadata to catch up")
            else:
                raise UnavailableError(f"partition {name}/{pid} kept changing; try again")
            await self._wait(_is(name, pid, wanted), f"{name}/{pid} to update")

    async def _wait(
        self, predicate: Callable[[MetadataSnapshot], bool], what: str, timeout: float = _APPLY_TIMEOUT
    ) -> MetadataSnapshot:
        try:
            return await self._mirror.wait_for(predicate, timeout)
        except TimeoutError:
            raise UnavailableError(f"timed out waiting for {what}") from None


def _stream_ready(snap: MetadataSnapshot, name: str) -> bool:
    stream = snap.stream(name)
    return stream is not None and len(snap.partitions_of(name)) == stream.partitions


def _changed_from(name: str, pid: int, record: PartitionRecord) -> Callable[[MetadataSnapshot], bool]:
    return lambda snap: snap.partition(name, pid) != record


def _is(name: str, pid: int, record: PartitionRecord) -> Callable[[MetadataSnapshot], bool]:
    return lambda snap: snap.partition(name, pid) == record
