"""Frame headers of the operations that move replicas between brokers: partition reassignment, broker
decommission, and listing reassignments in progress (``tidelog partition reassign``, ``tidelog broker
decommission``).

REASSIGN_PARTITIONS and DECOMMISSION_BROKER go to any broker, which forwards them to the controller
(``forwarded`` marks a request sent on that way, so that it never travels further); REASSIGN_PARTITIONS with
``generate`` and LIST_REASSIGNMENTS are answered by any broker from its metadata. They share the base
:class:`~tidelog.protocol.messages.Header`, the field types and the evolution rules of
:mod:`tidelog.protocol.messages`; their routes are in :mod:`tidelog.protocol.message_codec`.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from tidelog.protocol.messages import INT32_MAX, Header, Millis, Name, PartitionId

BytesPerSecond = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


class PartitionReplicas(Header, frozen=True):
    """One partition and a replica list (preferred leader first)."""

    stream: Name
    partition: PartitionId
    replicas: tuple[str, ...]


class ReassignPartitionsRequest(Header, frozen=True):
    """Start (or, with ``cancel``, undo) the reassignment of each partition in ``partitions`` to its
    ``replicas``; with ``generate``, propose ``partitions`` for ``streams`` (all when empty) that keep their
    replicas on ``brokers`` only, with the fewest moves, and change nothing. ``throttle_bps`` caps the bytes per
    second the leader sends each replica being added (0: no cap)."""

    partitions: tuple[PartitionReplicas, ...] = ()
    throttle_bps: BytesPerSecond = 0
    cancel: bool = False
    generate: bool = False
    brokers: tuple[str, ...] = ()
    streams: tuple[str, ...] = ()
    timeout_ms: Millis = 10_000
    forwarded: bool = False


class PartitionMove(Header, frozen=True):
    """A partition's replicas before a request and after it (the target, while it is under way)."""

    stream: str
    partition: PartitionId
    current: tuple[str, ...]
    proposed: tuple[str, ...]
    note: str = ""  # why it does not move now (decommission), empty when it does


class ReassignPartitionsResponse(Header, frozen=True):
    moves: tuple[PartitionMove, ...]


class DecommissionBrokerRequest(Header, frozen=True):
    """Move every replica off ``broker_id`` (as reassignments), so that it can be stopped for good."""

    broker_id: Name
    throttle_bps: BytesPerSecond = 0
    timeout_ms: Millis = 10_000
    forwarded: bool = False


class DecommissionBrokerResponse(Header, frozen=True):
    moves: tuple[PartitionMove, ...]


class ListReassignmentsRequest(Header, frozen=True):
    """How far the reassignment of each of ``partitions`` to its ``replicas`` is (``--verify``); every
    reassignment in progress when empty. With ``broker_id``: every partition with a replica on that broker
    (``broker decommission`` progress)."""

    partitions: tuple[PartitionReplicas, ...] = ()
    broker_id: str = ""


class ReassignmentStatus(Header, frozen=True):
    """One partition's reassignment: ``state`` is ``complete``, ``in-progress``, ``waiting`` (it cannot complete
    now: ``detail`` says why) or ``other`` (its replicas are neither the target nor moving to it)."""

    stream: str
    partition: PartitionId
    replicas: tuple[str, ...]
    target: tuple[str, ...]
    isr: tuple[str, ...]
    leader: str
    state: str
    detail: str
    throttle_bps: BytesPerSecond = 0


class ListReassignmentsResponse(Header, frozen=True):
    statuses: tuple[ReassignmentStatus, ...]
    replicas_on: Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)] = 0  # partitions with a replica on broker_id
