"""Assembling a broker's consumer-group parts, and their lifetime: what the broker process starts and stops.

Start (after the metadata mirror, before the protocol servers): follow the group records, then run the
controller's reconcile task (idle unless this broker is the controller) and the coordinator's heartbeat sweep.
Stop: cancel both tasks, stop following.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from tidelog.broker.config import BrokerConfig
from tidelog.broker.controller_link import ControllerLink
from tidelog.broker.groups.coordinator import GroupCoordinator
from tidelog.broker.groups.membership import GroupMembership
from tidelog.broker.groups.service import GroupService
from tidelog.metadata.controller_election import ControllerElection
from tidelog.metadata.group_mirror import GroupMirror
from tidelog.metadata.mirror import MetadataMirror
from tidelog.metadata.records import Keys


class GroupRuntime:
    """One broker's consumer groups: ``service`` for the protocol servers, ``start()`` and ``stop()``."""

    def __init__(
        self,
        broker_id: str,
        client: Any,
        keys: Keys,
        election: ControllerElection,
        mirror: MetadataMirror,
        link: ControllerLink | None,
        config: BrokerConfig,
    ) -> None:
        self.mirror = GroupMirror(client, keys)
        self.membership = GroupMembership(
            client,
            keys,
            election,
            mirror,
            self.mirror,
            coordinator_timeout=config.group_coordinator_timeout_ms / 1000,
        )
        self.coordinator = GroupCoordinator(
            broker_id,
            self.mirror,
            consumer_timeout=config.group_consumer_timeout_ms / 1000,
            expire=self._expire,
        )
        self.service = GroupService(
            broker_id,
            self.mirror,
            self.membership,
            self.coordinator,
            link,
            consumer_timeout_ms=config.group_consumer_timeout_ms,
            coordinator_timeout_ms=config.group_coordinator_timeout_ms,
        )
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await self.mirror.start()
        self._tasks = [
            asyncio.create_task(self.membership.run(), name="groups-reconcile"),
            asyncio.create_task(self.coordinator.run(), name="groups-heartbeats"),
        ]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.mirror.stop()

    async def _expire(self, group_id: str, consumer_id: str) -> None:
        await self.service.expire(group_id, consumer_id)
