"""Partitions whose log start-up recovery found damaged in the middle, and who may cut the damage.

Recovery (:mod:`tidelog.storage.recovery`) cuts a torn tail by itself, but not a damaged batch that intact
batches follow (:mod:`tidelog.storage.damage`): those were written, fsynced and most likely acknowledged. Who
may cut them, when a replica's log is opened:

- **the operator**, with the broker setting ``recovery_truncate_damaged=true``: every such log is cut at the
  damage (logged with the offsets lost).
- **a follower** of a replicated partition: it cuts at the damage and fetches the range again from its leader
  (epoch truncation, then fetching, as after any restart). The records are not lost: the leader holds them.
- nobody else. A single-replica partition, or one this broker leads (a leader with the cut log would make its
  followers cut their copies too), is **not opened**: the broker logs an ERROR naming the partition, the damaged
  offsets, what follows them and the exact action, and answers every request for the partition with
  CORRUPT_DATA saying the same. The metadata is unchanged, so the partition stays unavailable until the
  operator acts: for a leader with other in-sync replicas, a graceful stop of this broker (controlled shutdown
  hands its leaderships to in-sync replicas; restarted as a follower it cuts and fetches again); else the
  setting, and a restart.

A refusal is remembered per partition, so later metadata changes do not rerun recovery while the role is the
same; a leader that became a follower opens the log again (and may then cut).
"""

from __future__ import annotations

import logging

from tidelog.api.errors import CorruptDataError
from tidelog.metadata.records import PartitionRecord
from tidelog.metadata.snapshot import PartitionKey
from tidelog.storage.damage import DamagedLogError

log = logging.getLogger(__name__)

SETTING = "recovery_truncate_damaged"


class DamagedPartitions:
    """This broker's refusals to open a damaged log, and the rule for when a cut is allowed."""

    def __init__(self, broker_id: str, *, truncate_damaged: bool) -> None:
        self._broker_id = broker_id
        self._truncate = truncate_damaged
        self._refused: dict[PartitionKey, tuple[bool, str]] = {}  # key -> (refused as leader, the refusal)

    def may_cut(self, record: PartitionRecord) -> bool:
        """Whether recovery may cut damage in the middle of this replica's log (module docstring)."""
        return self._truncate or (len(record.replicas) > 1 and record.leader != self._broker_id)

    def still_refused(self, record: PartitionRecord) -> bool:
        """Whether the log was refused already in the role ``record`` gives this broker (so not opened again)."""
        refused = self._refused.get((record.stream, record.id))
        return refused is not None and refused[0] == (record.leader == self._broker_id)

    def refuse(self, record: PartitionRecord, exc: DamagedLogError) -> None:
        """Remember that the log was not opened, and log an ERROR naming the damage and the operator's action."""
        name = f"{record.stream}/{record.id}"
        others = [b for b in record.isr if b != self._broker_id]
        if len(record.replicas) > 1 and record.leader == self._broker_id and others:
            action = (
                f"another in-sync replica ({', '.join(others)}) holds these records: stop broker {self._broker_id} "
                "gracefully (SIGTERM: controlled shutdown hands its leaderships to in-sync replicas); restarted as a "
                "follower it cuts the damage and fetches the range again"
            )
        else:
            lost = exc.damage.intact_batches
            action = (
                f"no other replica holds these records: copy what can be saved from {exc.directory} if needed, then "
                f"set {SETTING}=true (TIDELOG_{SETTING.upper()}=true) and restart broker {self._broker_id} to cut "
                f"the log at offset {exc.damage.first_offset}, giving up the {lost} intact batch(es) after the damage"
            )
        message = f"{name} was not opened: start-up recovery found {exc.damage.describe()}. To resolve: {action}"
        self._refused[(record.stream, record.id)] = (record.leader == self._broker_id, message)
        log.error("%s", message)

    def refused(self) -> list[PartitionKey]:
        return list(self._refused)

    def forget(self, key: PartitionKey) -> None:
        """The partition was deleted, or its log opened after all."""
        self._refused.pop(key, None)

    def error(self, key: PartitionKey) -> CorruptDataError | None:
        """What a request for the partition gets while its log stays unopened, else None."""
        refused = self._refused.get(key)
        return None if refused is None else CorruptDataError(refused[1])
