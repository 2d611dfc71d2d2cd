"""A leader hands its partition to another in-sync replica through the controller, and asks until it is taken.

Two replicas of this broker give up leading for a reason of their own, and both ask the same way: a leader whose
log start-up recovery found damaged in the middle (:mod:`tidelog.broker.partitions.damaged`), and a leader whose
disk failed a write or an fsync (:mod:`tidelog.broker.partitions.failed_logs`). The request is an AlterIsr with an
ISR without the leader (:func:`~tidelog.metadata.controller_plans.decide_alter_isr`): the controller hands the
leadership, one epoch later, to the first live in-sync replica, a clean election since every ISR member holds
everything committed, and leaves the old leader out of the ISR. It rejoins as any follower does, once it has
caught up again.

:func:`step_down` retries until the controller answers: a fenced request ends it (another leadership began: the
metadata moves this replica on); a refused one (no other ISR member is live right now) is logged once and asked
again slowly, until it is taken or the caller cancels it (the record changed: it asks again with the new one).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from tidelog.clock import Clock
from tidelog.metadata.records import PartitionRecord
from tidelog.protocol.errors import FencedLeaderEpochError, TidelogError

log = logging.getLogger(__name__)

STEP_DOWN_RETRY_MAX = 5.0  # seconds between attempts to reach the controller, at most

AlterIsr = Callable[[PartitionRecord, tuple[str, ...]], Awaitable[None]]
"""Asks the controller to set a partition's ISR: (the record the leader acts on, the ISR it wants)."""


async def step_down(
    alter_isr: AlterIsr, record: PartitionRecord, broker_id: str, others: Sequence[str], clock: Clock
) -> None:
    """Ask the controller for the ISR ``others`` (``record``'s ISR without ``broker_id``, its leader) until it
    takes it, the request is fenced, or the caller cancels (see the module docstring)."""
    name = f"{record.stream}/{record.id}"
    delay = 0.1
    refused = False
    while True:
        try:
            await alter_isr(record, tuple(others))
        except FencedLeaderEpochError as exc:
            log.warning("%s: step-down of leader %s fenced: %s", name, broker_id, exc)
            return
        except TidelogError as exc:
            if not exc.retriable:
                if not refused:
                    log.error("%s: the controller refused the step-down of %s: %s", name, broker_id, exc)
                refused, delay = True, STEP_DOWN_RETRY_MAX
                await clock.sleep(delay)
                continue
            failure: Exception = exc
        except (OSError, ConnectionError) as exc:
            failure = exc
        else:
            log.warning("%s: leader %s stepped down for in-sync replicas %s", name, broker_id, ", ".join(others))
            return
        log.warning("%s: could not step down yet (%s); retrying in %.1fs", name, failure, delay)
        await clock.sleep(delay)
        delay = min(delay * 2, STEP_DOWN_RETRY_MAX)
