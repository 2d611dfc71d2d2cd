"""Fail to safety in the metadata: the controller's decisions on suspending a partition and confirming its head.

Pure functions of a partition record, as :mod:`tidelog.metadata.controller_plans` (no I/O, no clock): the
:class:`~tidelog.metadata.controller.Controller` writes what they return with a compare-and-swap on the exact
record they decided on, fenced by its controller epoch. What the leader does around them, and why, is in
:mod:`tidelog.broker.partitions.safety`.

- :func:`decide_suspend`: a leader reports evidence that its partition lost consistency. Accepted only from the
  leader of the record's leader epoch (as AlterIsr): a deposed leader's finding is about a log that no longer
  leads. The first evidence is kept; the partition stays suspended across leader changes until reset-head.
- :func:`decide_reset_head`: an operator confirms the head. Checked against what the leader itself reports
  (:class:`LeaderBounds`), which cannot move under the check: a suspended leader takes no appends.
"""

from __future__ import annotations

import enum
from collections.abc import Set
from dataclasses import dataclass

import msgspec

from tidelog.metadata.controller_plans import OFFLINE, check_leadership
from tidelog.metadata.fenced_writer import ControllerError
from tidelog.metadata.records import PartitionRecord


class HeadRejection(enum.Enum):
    """Why a suspension or a head confirmation was refused."""

    UNKNOWN_PARTITION = "unknown-partition"
    """No such partition (the stream was deleted)."""
    STALE_EPOCH = "stale-epoch"
    """A suspension reported under an older leader epoch: that leader was deposed."""
    NEWER_EPOCH = "newer-epoch"
    """A suspension reported under a newer leader epoch than the controller knows: its view lags. Retriable."""
    NOT_LEADER = "not-leader"
    """The epoch matches but the reporter is not the leader."""
    NO_LEADER = "no-leader"
    """The partition has no live leader: nobody holds a head to confirm. Retriable once one is elected."""
    LEADER_LAGS = "leader-lags"
    """The leader has not taken the record the controller holds yet (or the controller's lags). Retriable."""
    NOT_SUSPENDED = "not-suspended"
    """Reset-head on a partition that takes appends: there is no head to confirm."""
    BAD_OFFSET = "bad-offset"
    """The head asked for is above the leader's log end (data cannot be invented) or below its high watermark
    (committed offsets are never reused)."""
    CONFLICT = "conflict"
    """The partition kept changing under the controller's compare-and-swap. Retriable."""


class SuspensionError(ControllerError):
    """A suspension or a reset-head the controller refused; nothing was written. ``reason`` says why."""

    def __init__(self, reason: HeadRejection, message: str, current: PartitionRecord | None = None) -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason
        self.detail = message
        """The message without the reason's name: what a client is told, with the error code that maps it."""
        self.current = current

    @property
    def retriable(self) -> bool:
        """Whether the same request may succeed later without anything being fixed first."""
        return self.reason in (
            HeadRejection.NEWER_EPOCH,
            HeadRejection.NO_LEADER,
            HeadRejection.LEADER_LAGS,
            HeadRejection.CONFLICT,
        )


@dataclass(frozen=True, slots=True)
class SuspendRequest:
    """A leader asks to record that it refuses appends, and why."""

    stream: str
    partition: int
    leader_id: str
    leader_epoch: int
    reason: str


@dataclass(frozen=True, slots=True)
class LeaderBounds:
    """What a partition's leader reports about itself (LIST_OFFSETS): the leadership it acts on, its high
    watermark and log end, and its own suspension (which may not be in etcd yet)."""

    leader_epoch: int
    high_watermark: int
    log_end: int
    suspended: str = ""


def decide_suspend(record: PartitionRecord | None, request: SuspendRequest, now_ns: int) -> PartitionRecord:
    """The record suspended for ``request.reason`` (unchanged when suspended already), or :class:`SuspensionError`."""
    record = check_leadership(
        record, request, "report", lambda kind, message, found: SuspensionError(HeadRejection[kind], message, found)
    )
    if record.suspended:
        return record  # the first evidence stands; the leader logs any later one
    return msgspec.structs.replace(record, suspended=request.reason, suspended_ns=now_ns)


def check_leader(record: PartitionRecord | None, name: str, live: Set[str]) -> PartitionRecord:
    """The record, when its partition exists and has a live leader to ask for its bounds."""
    if record is None:
        raise SuspensionError(HeadRejection.UNKNOWN_PARTITION, f"no partition {name}")
    if record.leader == OFFLINE or record.leader not in live:
        raise SuspensionError(
            HeadRejection.NO_LEADER,
            f"{name} has no live leader ({record.leader or 'offline'}): nothing holds a head to confirm",
            record,
        )
    return record


def decide_reset_head(record: PartitionRecord, bounds: LeaderBounds, offset: int | None) -> PartitionRecord:
    """The record resumed at the confirmed head, or :class:`SuspensionError`.

    The head is ``offset``, or the leader's log end when None. Not above the log end: records cannot be
    invented, and a head the leader does not hold would suspend it again. Not below the high watermark: those
    offsets are committed, consumers may have read them, and another record must never take one. In between
    the leader's uncommitted tail is cut. The new record has the suspension cleared and the next leader epoch
    (followers truncate again against the confirmed log, see :mod:`tidelog.broker.partitions.safety`), and remembers the
    head for that epoch.
    """
    name = f"{record.stream}/{record.id}"
    if bounds.leader_epoch != record.leader_epoch:
        raise SuspensionError(
            HeadRejection.LEADER_LAGS,
            f"{name}: leader {record.leader} reports epoch {bounds.leader_epoch}, the metadata says "
            f"{record.leader_epoch}",
            record,
        )
    reason = record.suspended or bounds.suspended
    if not reason:
        raise SuspensionError(
            HeadRejection.NOT_SUSPENDED, f"{name} is not suspended: it takes appends, there is no head to confirm"
        )
    head = bounds.log_end if offset is None else offset
    if head > bounds.log_end:
        raise SuspensionError(
            HeadRejection.BAD_OFFSET,
            f"{name}: offset {head} is beyond the leader's log end {bounds.log_end}; records cannot be invented",
            record,
        )
    if head < bounds.high_watermark:
        raise SuspensionError(
            HeadRejection.BAD_OFFSET,
            f"{name}: offset {head} is below the high watermark {bounds.high_watermark}; committed offsets are "
            "never cut",
            record,
        )
    epoch = record.leader_epoch + 1
    return msgspec.structs.replace(
        record, suspended="", suspended_ns=0, leader_epoch=epoch, head_epoch=epoch, head_offset=head
    )
