"""Following one etcd prefix: read it whole, then watch it from the next revision, through broken watches.

The broker's mirrors (:mod:`~tidelog.metadata.mirror`, :mod:`~tidelog.metadata.group_mirror`) see every change
of their prefix exactly once and in etcd's order, even when the watch breaks (its etcd member went away, the
connection dropped): the watch is made again from the newest revision applied, with a growing delay. That
revision is replayed whole, because etcd delivers the keys of one transaction as separate events and the break
may come between them; applying a key again changes nothing. When etcd has compacted that revision away, the
prefix is read whole again instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aetcd.exceptions import RevisionCompactedError

log = logging.getLogger(__name__)

REWATCH_DELAY = 0.1
"""Seconds before watching again after a break; doubled on each failure up to :data:`REWATCH_DELAY_MAX`."""
REWATCH_DELAY_MAX = 5.0

Load = Callable[[Any, bool], Awaitable[None]]
"""Called with a whole read of the prefix (its ``header.revision`` is the read's) and whether it is a re-read."""
Apply = Callable[[Any], Awaitable[None]]
"""Called with each watch event, in order."""


class PrefixFollower:
    """Reads ``prefix`` with ``load``, then hands each change to ``apply``; ``revision`` is the newest seen."""

    def __init__(self, client: Any, prefix: bytes, *, name: str, load: Load, apply: Apply) -> None:
        self._client = client
        self._prefix = prefix
        self._name = name
        self._load = load
        self._apply = apply
        self.revision = 0
        self.watching = False  # the prefix was read and its watch is up (False from a break until watched again)
        self._watch: Any = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._read(again=False)
        self._watch = await self._watch_from(self.revision + 1)
        self.watching = True
        self._task = asyncio.create_task(self._follow(), name=self._name)

    async def stop(self) -> None:
        self.watching = False
        if self._watch is not None:
            with contextlib.suppress(Exception):
                await self._watch.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _read(self, *, again: bool) -> None:
        result = await self._client.get_prefix(self._prefix)
        await self._load(result, again)
        self.revision = max(self.revision, int(result.header.revision))

    async def _watch_from(self, revision: int) -> Any:
        return await self._client.watch_prefix(self._prefix, start_revision=revision)

    async def _follow(self) -> None:
        failures = 0
        while True:
            try:
                async for event in self._watch:
                    failures = 0
                    self.revision = max(self.revision, int(event.kv.mod_revision))
                    await self._apply(event)
                raise ConnectionError("the watch ended")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                self.watching = False
                if failures == 1:
                    log.warning(
                        "%s: the watch broke at revision %d (%s); watching again", self._name, self.revision, exc
                    )
            await self._rewatch(failures)

    async def _rewatch(self, failures: int) -> None:
        delay = min(REWATCH_DELAY * 2 ** min(failures - 1, 6), REWATCH_DELAY_MAX)
        while True:
            await asyncio.sleep(delay)
            try:
                self._watch = await self._watch_from(self.revision)
                self.watching = True
                return
            except RevisionCompactedError:
                log.warning(
                    "%s: history before revision %d was compacted; reading it all again", self._name, self.revision
                )
                try:
                    await self._read(again=True)
                except Exception as exc:
                    log.debug("%s: re-read failed: %s", self._name, exc)
            except Exception as exc:
                log.debug("%s: watching again failed: %s; retrying in %.1fs", self._name, exc, delay)
            delay = min(delay * 2, REWATCH_DELAY_MAX)
