"""Partitions whose log start-up recovery found damaged in the middle, and who may cut the damage.

Recovery (:mod:`tidelog.storage.recovery`) cuts a torn tail by itself, but not a damaged batch that intact
batches follow (:mod:`tidelog.storage.recovery_damage`): those were written, fsynced and most likely acknowledged. Who
may cut them, when a replica's log is opened:

- **the operator**, with the broker setting ``recovery_truncate_damaged=true``: every such log is cut at the
  damage (logged with the offsets lost).
- **a follower** of a replicated partition with a leader: it cuts at the damage and fetches the range again
  from its leader (epoch truncation, then fetching, as after any restart). The records are not lost: the leader
  holds them. Without a leader (the partition is offline, perhaps waiting for this very replica) it does not
  cut: it waits for one.
- nobody else. A single-replica partition, or one this broker leads (a leader with the cut log would make its
  followers cut their copies too), is **not opened**: the broker logs an ERROR naming the partition, the damaged
  offsets, what follows them and what happens next, and answers every request for the partition with
  CORRUPT_DATA saying the same.

  - A leader with other in-sync replicas **steps down**: it asks the controller for an ISR without itself
    (AlterIsr, :func:`~tidelog.metadata.controller_plans.decide_alter_isr`), which hands the leadership to a
    live in-sync replica one epoch later — a replica that holds the records. The new record makes this broker
    a follower: it opens the log again, now cutting at the damage, and fetches the range from the new leader,
    then rejoins the ISR as any follower does. The request is retried until the controller answers (or the
    record moves on).
  - Otherwise no replica holds the records: the partition stays unavailable until the operator sets
    ``recovery_truncate_damaged=true`` and restarts the broker (the ERROR says so, with the offsets at stake).

The setting does not make a leader that can step down cut: a replica holds the records, so nothing needs to be
lost. A refusal is remembered per partition with the leader and ISR it was made under, so later metadata changes
do not rerun recovery while they are the same; under another leader or ISR the log is opened again (and may then
be cut: a follower now, or the last in-sync replica with the setting on).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from tidelog.broker.partitions.partition import AlterIsr
from tidelog.broker.partitions.step_down import step_down
from tidelog.clock import Clock, SystemClock
from tidelog.metadata.controller_plans import OFFLINE
from tidelog.metadata.records import PartitionRecord
from tidelog.metadata.snapshot import PartitionKey
from tidelog.protocol.errors import CorruptDataError
from tidelog.storage.recovery_damage import DamagedLogError

log = logging.getLogger(__name__)

SETTING = "recovery_truncate_damaged"


class DamagedPartitions:
    """This broker's refusals to open a damaged log, and the rule for when a cut is allowed."""

    def __init__(
        self,
        broker_id: str,
        *,
        truncate_damaged: bool,
        alter_isr: AlterIsr | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._broker_id = broker_id
        self._clock: Clock = clock or SystemClock()
        self._truncate = truncate_damaged
        self._alter_isr = alter_isr
        # key -> ((leader, ISR) then, the refusal, the partition's directory)
        self._refused: dict[PartitionKey, tuple[tuple[str, tuple[str, ...]], str, Path]] = {}
        self._stepping_down: dict[PartitionKey, asyncio.Task[None]] = {}

    def may_cut(self, record: PartitionRecord) -> bool:
        """Whether recovery may cut damage in the middle of this replica's log (module docstring). A leader that
        can step down to another in-sync replica does so even when the setting allows a cut: nothing is lost."""
        if len(record.replicas) > 1 and record.leader not in (OFFLINE, self._broker_id):
            return True
        return self._truncate and not self._can_step_down(record)

    def _can_step_down(self, record: PartitionRecord) -> bool:
        others = any(b != self._broker_id for b in record.isr)
        return record.leader == self._broker_id and others and self._alter_isr is not None

    def still_refused(self, record: PartitionRecord) -> bool:
        """Whether the log was refused already under the leader and ISR ``record`` names (then it is not opened
        again; another leader or ISR may change the answer)."""
        refused = self._refused.get((record.stream, record.id))
        return refused is not None and refused[0] == (record.leader, record.isr)

    def refuse(self, record: PartitionRecord, exc: DamagedLogError) -> None:
        """Remember that the log was not opened, and log an ERROR naming the damage and the operator's action."""
        name = f"{record.stream}/{record.id}"
        key = (record.stream, record.id)
        others = tuple(b for b in record.isr if b != self._broker_id)
        stepping = self._can_step_down(record)
        if stepping:
            action = (
                f"another in-sync replica ({', '.join(others)}) holds these records: broker {self._broker_id} steps "
                "down as leader, then cuts the damage and fetches the range again as a follower (nothing to do)"
            )
        elif record.leader == OFFLINE and len(record.replicas) > 1:
            action = (
                f"the partition has no leader: once another replica leads, broker {self._broker_id} cuts the damage "
                "and fetches the range again as its follower (if it is elected itself, it refuses again and says why)"
            )
        else:
            lost = exc.damage.intact_batches
            action = (
                f"no other replica holds these records: copy what can be saved from {exc.directory} if needed, then "
                f"set {SETTING}=true (TIDELOG_{SETTING.upper()}=true) and restart broker {self._broker_id} to cut "
                f"the log at offset {exc.damage.first_offset}, giving up the {lost} intact batch(es) after the damage"
            )
        message = f"{name} was not opened: start-up recovery found {exc.damage.describe()}. To resolve: {action}"
        self._refused[key] = ((record.leader, record.isr), message, Path(exc.directory))
        log.error("%s", message)
        running = self._stepping_down.pop(key, None)
        if running is not None:
            running.cancel()  # asked with an older record: ask again with this one
        if stepping:
            assert self._alter_isr is not None
            task = asyncio.create_task(
                step_down(self._alter_isr, record, self._broker_id, others, self._clock), name=f"step-down-{name}"
            )
            self._stepping_down[key] = task
            task.add_done_callback(lambda done: self._forget_task(key, done))

    def _forget_task(self, key: PartitionKey, done: asyncio.Task[None]) -> None:
        if self._stepping_down.get(key) is done:  # not a newer one that replaced it
            del self._stepping_down[key]

    def refused(self) -> list[PartitionKey]:
        return list(self._refused)

    def forget(self, key: PartitionKey) -> Path | None:
        """The partition was deleted, or its log opened after all; returns its directory if it was refused."""
        refused = self._refused.pop(key, None)
        task = self._stepping_down.pop(key, None)
        if task is not None:
            task.cancel()
        return None if refused is None else refused[2]

    async def close(self) -> None:
        """Stop every step-down still under way (the broker stops)."""
        tasks, self._stepping_down = list(self._stepping_down.values()), {}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def error(self, key: PartitionKey) -> CorruptDataError | None:
        """What a request for the partition gets while its log stays unopened, else None."""
        refused = self._refused.get(key)
        return None if refused is None else CorruptDataError(refused[1])
