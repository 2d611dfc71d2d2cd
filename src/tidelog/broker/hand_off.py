"""Controlled shutdown's hand-off: on SIGTERM a broker asks the controller to move its leaderships elsewhere and
waits, within the shutdown timeout, until its own metadata shows them gone, so in-flight writes fail over instead
of timing out.

Brokers stopping together hand leaderships to each other, and an answer may come from a controller that had not
yet seen all of that (or has since stepped down). So the broker asks again whenever it gains a leadership while
waiting, and at least every :data:`RECHECK` seconds, as the controller expects of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging

from tidelog.broker.controller_link import ControllerLink
from tidelog.metadata.mirror import MetadataMirror
from tidelog.metadata.snapshot import MetadataSnapshot, PartitionKey

__all__ = ["RECHECK", "hand_off_leadership"]

log = logging.getLogger(__name__)

RECHECK = 1.0
"""Seconds between a stopping broker's hand-off requests while it still leads more than the controller said."""


async def hand_off_leadership(broker_id: str, link: ControllerLink, mirror: MetadataMirror, grace: float) -> None:
    """Hand ``broker_id``'s leaderships off (see the module docstring); log how it went, never raise."""
    if len(mirror.snapshot.brokers) < 2:
        return

    def led(snapshot: MetadataSnapshot) -> set[PartitionKey]:
        return {key for key, p in snapshot.partitions.items() if p.leader == broker_id}

    def settled_or_gained(remaining: int, before: set[PartitionKey], snapshot: MetadataSnapshot) -> bool:
        now = led(snapshot)
        return len(now) <= remaining or not now <= before

    try:
        async with asyncio.timeout(grace):
            while True:
                before = led(mirror.snapshot)
                remaining = await link.controlled_shutdown(grace)
                with contextlib.suppress(TimeoutError):
                    now = await mirror.wait_for(functools.partial(settled_or_gained, remaining, before), RECHECK)
                    if len(led(now)) <= remaining:
                        break
        log.info("broker %s: leadership handed off (%d partition(s) had no other ISR member)", broker_id, remaining)
    except Exception as exc:
        log.warning("broker %s: controlled shutdown incomplete: %s", broker_id, exc)
