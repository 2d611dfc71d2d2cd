"""The internal stream ``__cursors``: created by the controller, reserved against clients.

Cursors (:mod:`tidelog.broker.cursors`) live in ``__cursors``, a key-compacted stream whose partition count and
replication factor are broker settings (``cursors_stream_partitions``, ``cursors_stream_replication_factor``).
Like Liftbridge, the broker that is the controller creates it, so that it exists before any client asks
(Liftbridge clients look its partitions up in the metadata before they send a cursor request). Every broker runs
a :class:`CursorStreamKeeper` until the stream exists; only the controller's acts, so a controller that fails
over before creating it leaves the work to the next one. With a positive replication factor the keeper waits
until that many brokers are alive (Kafka does the same for its offsets topic): a cluster whose brokers are still
starting never gets a ``__cursors`` with fewer replicas than configured.

The stream is listed in metadata like any other (Liftbridge lists it too, and its clients find the cursor
partitions' leaders there), but clients can neither create nor delete it: those requests are INVALID_ARGUMENT
(:data:`RESERVED_STREAMS`, checked by :class:`~tidelog.broker.streams.StreamAdmin`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from tidelog.broker.streams import StreamAdmin
from tidelog.metadata.mirror import MetadataMirror
from tidelog.metadata.records import StreamConfig
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.protocol.cursors import CURSORS_STREAM

log = logging.getLogger(__name__)

CURSORS_SUBJECT = "_tidelog.cursors"
"""The NATS subject of ``__cursors`` (nothing is meant to publish there; the leaders listen as for any stream)."""

CURSORS_CONFIG = StreamConfig(
    compact_enabled=True, retention_max_age_ms=0, retention_max_bytes=0, retention_max_messages=0
)
"""Compacted, and never cut by age, size or count: a cursor set once and left alone for weeks (a consumer that
stopped) keeps its newest record, which retention would otherwise delete with its segment. Compaction alone
bounds the stream: one record per cursor, plus what arrived since the last cleaning."""

_RECHECK = 5.0  # seconds between looks at the controller and the brokers while waiting
_RETRY_FIRST = 0.5  # seconds before retrying a creation that failed; doubles each time
_RETRY_MAX = 10.0


class Controlling(Protocol):
    """What the keeper needs of the controller election."""

    @property
    def is_controller(self) -> bool: ...

    async def wait_for(self, predicate: Callable[[Controlling], bool], timeout: float | None = None) -> object: ...


class CursorStreamKeeper:
    """Has the controller create ``__cursors`` once the cluster can hold it (see the module docstring)."""

    def __init__(
        self,
        admin: StreamAdmin,
        mirror: MetadataMirror,
        election: Controlling,
        *,
        partitions: int,
        replication_factor: int,
        stream: str = CURSORS_STREAM,
        subject: str = CURSORS_SUBJECT,
        config: StreamConfig = CURSORS_CONFIG,
    ) -> None:
        """``partitions`` 0: cursors are disabled and nothing is created. ``stream``, ``subject`` and ``config``
        name another internal stream kept the same way (``__activity``, :mod:`tidelog.broker.activity_stream`)."""
        self._stream, self._subject, self._config = stream, subject, config
        self._admin = admin
        self._mirror = mirror
        self._election = election
        self._partitions = partitions
        self._replication_factor = replication_factor or 1  # Liftbridge: 0 means 1
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._partitions > 0 and self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"{self._stream}-keeper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _exists(self, snap: MetadataSnapshot) -> bool:
        return snap.stream(self._stream) is not None

    def _can_create(self, snap: MetadataSnapshot) -> bool:
        return self._replication_factor == -1 or len(snap.brokers) >= self._replication_factor

    async def _run(self) -> None:
        delay = _RETRY_FIRST
        while not self._exists(self._mirror.snapshot):
            try:
                await self._election.wait_for(lambda e: e.is_controller, _RECHECK)
                await self._mirror.wait_for(lambda s: self._exists(s) or self._can_create(s), _RECHECK)
            except TimeoutError:
                continue
            if self._exists(self._mirror.snapshot) or not self._election.is_controller:
                continue
            try:
                await self._admin.create_stream(
                    name=self._stream,
                    subject=self._subject,
                    partitions=self._partitions,
                    replication_factor=self._replication_factor,
                    config=self._config,
                    internal=True,
                )
            except Exception as exc:  # logged and retried: cursors wait for it, nothing else does
                log.warning("cannot create %s yet (retrying in %.1fs): %s", self._stream, delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX)
        log.debug("%s exists", self._stream)
