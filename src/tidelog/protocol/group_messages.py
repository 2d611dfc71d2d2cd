"""Frame headers of the consumer-group ops: the same operations as Liftbridge's group RPCs, so a native client can
be a member without gRPC (:mod:`tidelog.broker.groups`)::

    JOIN_GROUP         JoinGroupRequest          JoinGroupResponse
    LEAVE_GROUP        LeaveGroupRequest         LeaveGroupResponse
    GROUP_ASSIGNMENTS  GroupAssignmentsRequest   GroupAssignmentsResponse   (the coordinator answers; a heartbeat)
    REPORT_COORDINATOR ReportCoordinatorRequest  ReportCoordinatorResponse
    DESCRIBE_GROUP     DescribeGroupRequest      DescribeGroupResponse      (any broker; where the coordinator is)
    LIST_GROUPS        ListGroupsRequest         ListGroupsResponse
    DELETE_GROUP       DeleteGroupRequest        DeleteGroupResponse        (a __cursors partition's leader)

Ids are checked by the broker (not here), so a bad id gets INVALID_ARGUMENT naming the rule rather than a
malformed header. ``forwarded`` marks a request a broker sent on to the controller
(:mod:`tidelog.broker.controller_link`). Routed by :mod:`tidelog.protocol.message_codec`.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from tidelog.protocol.messages import INT64_MAX, Header, Millis, PartitionId

GroupEpoch = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]  # an etcd revision (Liftbridge: uint64)


class JoinGroupRequest(Header, frozen=True):
    """Join ``group_id`` (created if needed) as ``consumer_id``, consuming ``streams``."""

    group_id: str
    consumer_id: str
    streams: tuple[str, ...]
    forwarded: bool = False


class JoinGroupResponse(Header, frozen=True):
    """Where to heartbeat, at which epoch, and the broker's timeouts (milliseconds)."""

    coordinator: str
    epoch: GroupEpoch
    consumer_timeout_ms: int
    coordinator_timeout_ms: int


class LeaveGroupRequest(Header, frozen=True):
    group_id: str
    consumer_id: str
    expired: bool = False  # sent by the coordinator for a member that stopped heartbeating
    forwarded: bool = False


class LeaveGroupResponse(Header, frozen=True):
    pass


class GroupAssignmentsRequest(Header, frozen=True):
    group_id: str
    consumer_id: str
    epoch: GroupEpoch


class StreamAssignment(Header, frozen=True):
    stream: str
    partitions: tuple[int, ...]


class GroupAssignmentsResponse(Header, frozen=True):
    epoch: GroupEpoch
    assignments: tuple[StreamAssignment, ...]


class ReportCoordinatorRequest(Header, frozen=True):
    """``consumer_id`` says ``coordinator`` (of group ``epoch``) does not answer."""

    group_id: str
    consumer_id: str
    coordinator: str
    epoch: GroupEpoch
    forwarded: bool = False


class ReportCoordinatorResponse(Header, frozen=True):
    pass


class DescribeGroupRequest(Header, frozen=True):
    group_id: str


class GroupMemberInfo(Header, frozen=True):
    consumer_id: str
    streams: tuple[str, ...]
    assignments: tuple[StreamAssignment, ...]


class DescribeGroupResponse(Header, frozen=True):
    """The group as the answering broker's mirror holds it (UNKNOWN_GROUP when there is none)."""

    group_id: str
    coordinator: str
    epoch: GroupEpoch
    members: tuple[GroupMemberInfo, ...]


class ListGroupsRequest(Header, frozen=True):
    pass


class GroupSummary(Header, frozen=True):
    group_id: str
    coordinator: str
    epoch: GroupEpoch
    members: int


class ListGroupsResponse(Header, frozen=True):
    groups: tuple[GroupSummary, ...]  # sorted by group id


class DeleteGroupRequest(Header, frozen=True):
    """Delete the committed offsets (cursors of id ``group_id``) that ``__cursors`` partition
    ``cursors_partition`` holds; sent to that partition's leader, which refuses (GROUP_REFUSED) while the group has
    members. A client deletes a group by sending this to the leader of every ``__cursors`` partition."""

    group_id: str
    cursors_partition: PartitionId
    timeout_ms: Millis = 10_000


class DeleteGroupResponse(Header, frozen=True):
    deleted: int  # cursors deleted (tombstones written to the partition, committed to its ISR)
