"""The controller's activity feed: every committed metadata change, published to ``__activity`` at least once.

While its broker is the controller, :meth:`ActivityFeed.run` (a term task of the
:class:`~tidelog.metadata.controller.Controller`) watches the cluster's prefix in etcd with each key's previous
value, turns every revision's changes into events (:func:`~tidelog.metadata.activity.events_of`) and hands them to
``publish`` (which appends them to ``__activity``, acks all). The events of one watch response (one or more whole
revisions: etcd never splits a revision between responses unless asked to) are published as one batch, then the
feed records the newest revision published under ``{prefix}/activity-published``, through the term's fenced writer.

**Resuming.** A new controller (or the same one after an error) watches again from the revision after the one
recorded: etcd replays its history from there, so no change committed meanwhile is missed. The batch in flight when
the old controller stopped may be published twice; its events keep their ids (the revision they report), so
consumers drop the copies by id. Before the first publication the feed starts at the revision that created
``__activity`` (the stream's own creation is its first event).

**Compaction.** etcd forgets history older than its compaction point (tidelog's embedded etcd keeps one hour). A
controller that resumes from a revision already compacted cannot know what happened in between: the feed logs an
error naming the revisions lost and goes on from the oldest one etcd still holds. That takes a cluster without a
controller for longer than the compaction retention; lengthen the retention of an external etcd if that matters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aetcd.exceptions import RevisionCompactedError

from tidelog.metadata.activity import ACTIVITY_STREAM, Change, events_of
from tidelog.metadata.fenced_writer import ControllerFencedError, FencedWriter
from tidelog.metadata.mirror import MetadataMirror
from tidelog.metadata.records import Keys, decode_counter, encode_counter
from tidelog.protocol._gen import api_pb2 as pb

log = logging.getLogger(__name__)

Publish = Callable[[Sequence[pb.ActivityStreamEvent]], Awaitable[None]]
"""Appends events to ``__activity`` in order, all committed when it returns; raises when it could not."""

_END = object()


def published_key(keys: Keys) -> bytes:
    """Where the feed records the newest revision whose events are published (a msgpack integer)."""
    return f"{keys.prefix}/activity-published".encode()


class ActivityFeed:
    """Publishes the cluster's metadata changes while this broker is the controller (see the module docstring)."""

    def __init__(
        self,
        client: Any,
        keys: Keys,
        mirror: MetadataMirror,
        publish: Publish,
        *,
        retry_initial: float = 0.2,
        retry_max: float = 5.0,
    ) -> None:
        self._client = client
        self._keys = keys
        self._mirror = mirror
        self._publish = publish
        self._retry_initial = retry_initial
        self._retry_max = retry_max
        self._backoff = retry_initial  # doubles with each failure in a row, back to retry_initial on a success
        self.published = 0
        """The newest revision published by this broker (0: none yet); for tests and logs."""

    async def run(self, writer: FencedWriter) -> None:
        """Publish until the term ends (cancelled, or a fenced write); errors are logged and retried from etcd."""
        self._backoff = self._retry_initial
        while True:
            try:
                await self._follow(writer)
            except ControllerFencedError:
                return
            except Exception as exc:  # etcd or __activity unavailable: resume from the recorded revision
                said = str(exc) or type(exc).__name__
                log.warning("activity feed: %s; resuming from etcd in %.1fs", said, self._backoff)
                await asyncio.sleep(self._backoff)
                self._backoff = min(self._backoff * 2, self._retry_max)

    async def _follow(self, writer: FencedWriter) -> None:
        start = await self._start_revision()
        while True:
            compacted = await self._watch(writer, start)
            log.error(
                "activity feed: etcd compacted its history up to revision %d; the events of revisions %d to %d are "
                "lost, publishing from revision %d on",
                compacted,
                start,
                compacted - 1,
                compacted,
            )
            start = compacted

    async def _watch(self, writer: FencedWriter, start: int) -> int:
        """Publish the changes from revision ``start`` on; return the revision to go on from when etcd compacted
        what was asked for, raise when the watch ends otherwise."""
        prefix = self._keys.prefix.encode() + b"/"
        try:
            watch = await self._client.watch_prefix(prefix, start_revision=start, prev_kv=True)
        except RevisionCompactedError as exc:
            return int(exc.compacted_revision)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        pump = asyncio.create_task(_pump(watch, queue), name="activity-watch")
        try:
            while True:
                batch = [await queue.get()]
                while not queue.empty():  # the rest of the response: the pump moved it without yielding
                    batch.append(queue.get_nowait())
                ended = [item for item in batch if item is _END or isinstance(item, BaseException)]
                events = [item for item in batch if item is not _END and not isinstance(item, BaseException)]
                await self._publish_batch(writer, events)
                if ended:
                    if isinstance(ended[0], RevisionCompactedError):
                        return int(ended[0].compacted_revision)
                    raise ConnectionError(f"the etcd watch ended ({'closed' if ended[0] is _END else ended[0]})")
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pump
            with contextlib.suppress(Exception):
                await watch.cancel()

    async def _publish_batch(self, writer: FencedWriter, watch_events: Sequence[Any]) -> None:
        by_revision: dict[int, list[Change]] = {}
        for event in watch_events:
            kv = event.kv
            deleted = event.kind == "DELETE"
            if not deleted and int(kv.version) == 1:
                previous: bytes | None = None  # the key was created
            else:  # b"": it existed, but etcd no longer holds its previous value (compacted)
                previous = bytes(event.prev_kv.value) if event.prev_kv is not None else b""
            revision = int(kv.mod_revision)
            value = None if deleted else bytes(kv.value)
            by_revision.setdefault(revision, []).append(Change(revision, bytes(kv.key), value, previous))
        events = [e for revision in sorted(by_revision) for e in events_of(self._keys, revision, by_revision[revision])]
        if not events:
            return
        await self._publish(events)
        newest = max(by_revision)
        await writer.put(published_key(self._keys), encode_counter(newest))
        self.published = newest
        self._backoff = self._retry_initial

    async def _start_revision(self) -> int:
        """The revision after the newest one published, or the one that created ``__activity``."""
        got = await self._client.get(published_key(self._keys))
        if got is not None:
            return decode_counter(bytes(got.value)) + 1
        await self._mirror.wait_for(lambda s: s.stream(ACTIVITY_STREAM) is not None)
        stream = await self._client.get(self._keys.stream(ACTIVITY_STREAM))
        if stream is None:
            raise RuntimeError(f"{ACTIVITY_STREAM} is in the metadata mirror but not in etcd")
        return int(stream.create_revision)


async def _pump(watch: Any, queue: asyncio.Queue[Any]) -> None:
    """Move watch events to ``queue``; then :data:`_END`, or the error that ended the watch."""
    try:
        async for event in watch:
            queue.put_nowait(event)
        queue.put_nowait(_END)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        queue.put_nowait(exc)
