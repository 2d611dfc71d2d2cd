"""What every request touches: the one table per protocol the authorizer checks **before** any handler runs.

Each wire op (:data:`WIRE_ACCESS`, by :class:`~tidelog.protocol.frames.Op`) and each gRPC method
(:data:`GRPC_ACCESS`, by its full name) maps to a rule: a function of the decoded request giving the
:class:`Access` it needs — a resource type, a name and an operation; all of them must be allowed — or one of two
markers:

- :data:`BROKERS_ONLY` — broker-to-broker ops (replication, ISR changes, controlled shutdown, suspension): only
  broker principals and super users; no ACL grants them;
- :data:`OPEN` — the standard gRPC health service, which says only whether the broker serves.

A method or op missing from its table is denied (and a test fails for every op and method the servers serve that
is not here). For requests that stream (``PublishAsync``, ``tidelog.v1.Appender/Append``), the rule is applied to
every message before it is passed on.

Choices worth knowing (docs/security.md lists them for operators): metadata of every stream (a request naming no
stream), the list of streams and the list of groups need ``describe`` on ``cluster``; ``PublishToSubject`` needs
``write`` on ``cluster``, since a NATS subject may reach any stream; an idempotent producer's id
(``INIT_PRODUCER``) needs ``write`` on ``cluster``; cursors need ``read`` on their stream, and listing the
cursors of one id needs ``describe`` on the group of that id.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, NamedTuple

from tidelog.metadata.acl_records import CLUSTER_NAME, Operation, ResourceType
from tidelog.protocol.frames import Op

__all__ = ["BROKERS_ONLY", "GRPC_ACCESS", "OPEN", "WIRE_ACCESS", "Access", "Rule"]


class Access(NamedTuple):
    """One permission a request needs."""

    resource: ResourceType
    name: str
    operation: Operation

    def __str__(self) -> str:
        if self.resource is ResourceType.CLUSTER:
            return f"{self.operation} cluster"
        return f"{self.operation} {self.resource} {self.name!r}"


class _Marker(NamedTuple):
    label: str


BROKERS_ONLY: Final = _Marker("brokers only")
OPEN: Final = _Marker("open")

Rule = Callable[[Any], tuple[Access, ...]] | _Marker


def _stream(operation: Operation, field: str = "stream") -> Callable[[Any], tuple[Access, ...]]:
    def rule(request: Any) -> tuple[Access, ...]:
        return (Access(ResourceType.STREAM, getattr(request, field), operation),)

    return rule


def _group(operation: Operation, field: str) -> Callable[[Any], tuple[Access, ...]]:
    def rule(request: Any) -> tuple[Access, ...]:
        return (Access(ResourceType.GROUP, getattr(request, field), operation),)

    return rule


def _cluster(operation: Operation) -> Callable[[Any], tuple[Access, ...]]:
    access = (Access(ResourceType.CLUSTER, CLUSTER_NAME, operation),)
    return lambda _request: access


def _join(group_field: str) -> Callable[[Any], tuple[Access, ...]]:
    def rule(request: Any) -> tuple[Access, ...]:
        group = Access(ResourceType.GROUP, getattr(request, group_field), Operation.READ)
        return (group, *(Access(ResourceType.STREAM, s, Operation.READ) for s in request.streams))

    return rule


def _metadata(request: Any) -> tuple[Access, ...]:
    needed = [Access(ResourceType.STREAM, s, Operation.DESCRIBE) for s in request.streams]
    if not request.streams:
        needed.append(Access(ResourceType.CLUSTER, CLUSTER_NAME, Operation.DESCRIBE))
    needed += [Access(ResourceType.GROUP, g, Operation.DESCRIBE) for g in getattr(request, "groups", ())]
    return tuple(needed)


def _wire_append(request: Any) -> tuple[Access, ...]:
    # BEGIN names the stream; CHUNK, COMMIT and ABORT act on the connection's own append begun after that check.
    return (Access(ResourceType.STREAM, request.stream, Operation.WRITE),) if request.stream else ()


def _grpc_append(request: Any) -> tuple[Access, ...]:
    if not request.HasField("header"):
        return ()  # records and commit of the append whose header (first message) was checked
    return (Access(ResourceType.STREAM, request.header.stream, Operation.WRITE),)


R, W, C, D, A, DESC = (
    Operation.READ,
    Operation.WRITE,
    Operation.CREATE,
    Operation.DELETE,
    Operation.ALTER,
    Operation.DESCRIBE,
)

WIRE_ACCESS: Final[dict[int, Rule]] = {
    Op.PRODUCE: _stream(W),
    Op.FETCH: _stream(R),
    Op.APPEND: _wire_append,
    Op.LIST_OFFSETS: _stream(DESC),
    Op.INIT_PRODUCER: _cluster(W),
    Op.SET_CURSOR: _stream(R),
    Op.FETCH_CURSOR: _stream(R),
    Op.LIST_CURSORS: _group(DESC, "cursor_id"),
    Op.METADATA: _metadata,
    Op.CREATE_STREAM: _stream(C, "name"),
    Op.DELETE_STREAM: _stream(D, "name"),
    Op.LIST_STREAMS: _cluster(DESC),
    Op.SET_STREAM_STATE: _stream(A, "name"),
    Op.RESET_HEAD: _stream(A),
    Op.SKIP_DAMAGED: _stream(A),
    Op.ADD_PARTITIONS: _stream(A, "name"),
    Op.ALTER_STREAM: _stream(A, "name"),
    Op.ELECT_LEADERS: _cluster(A),
    Op.REASSIGN_PARTITIONS: _cluster(A),
    Op.DECOMMISSION_BROKER: _cluster(A),
    Op.LIST_REASSIGNMENTS: _cluster(DESC),
    Op.REPLICA_FETCH: BROKERS_ONLY,
    Op.EPOCH_END_OFFSET: BROKERS_ONLY,
    Op.SEGMENT_LIST: BROKERS_ONLY,
    Op.SEGMENT_FETCH: BROKERS_ONLY,
    Op.SESSION_FETCH: BROKERS_ONLY,
    Op.ALTER_ISR: BROKERS_ONLY,
    Op.REPORT_UNREACHABLE: BROKERS_ONLY,
    Op.CONTROLLED_SHUTDOWN: BROKERS_ONLY,
    Op.SUSPEND_PARTITION: BROKERS_ONLY,
    Op.JOIN_GROUP: _join("group_id"),
    Op.LEAVE_GROUP: _group(R, "group_id"),
    Op.GROUP_ASSIGNMENTS: _group(R, "group_id"),
    Op.REPORT_COORDINATOR: _group(R, "group_id"),
    Op.DESCRIBE_GROUP: _group(DESC, "group_id"),
    Op.LIST_GROUPS: _cluster(DESC),
    Op.DELETE_GROUP: _group(D, "group_id"),
    Op.SASL_START: OPEN,  # logging in is what gives the connection a principal
    Op.SASL_FINISH: OPEN,
}
"""The access each wire op needs (module docstring)."""

_API = "/proto.API/"
_ADMIN = "/tidelog.v1.Admin/"
GRPC_ACCESS: Final[dict[str, Rule]] = {
    _API + "CreateStream": _stream(C, "name"),
    _API + "DeleteStream": _stream(D, "name"),
    _API + "PauseStream": _stream(A, "name"),
    _API + "SetStreamReadonly": _stream(A, "name"),
    _API + "Subscribe": _stream(R),
    _API + "FetchMetadata": _metadata,
    _API + "FetchPartitionMetadata": _stream(DESC),
    _API + "Publish": _stream(W),
    _API + "PublishAsync": _stream(W),
    _API + "PublishToSubject": _cluster(W),
    _API + "SetCursor": _stream(R),
    _API + "FetchCursor": _stream(R),
    _API + "JoinConsumerGroup": _join("groupId"),
    _API + "LeaveConsumerGroup": _group(R, "groupId"),
    _API + "FetchConsumerGroupAssignments": _group(R, "groupId"),
    _API + "ReportConsumerGroupCoordinator": _group(R, "groupId"),
    "/tidelog.v1.Appender/Append": _grpc_append,
    # tidelog.v1.Admin: the rules of the wire ops it mirrors (ADD_PARTITIONS, ALTER_STREAM, REASSIGN_PARTITIONS, ...)
    _ADMIN + "AddPartitions": _stream(A),
    _ADMIN + "AlterStream": _stream(A),
    _ADMIN + "GenerateReassignment": _cluster(A),
    _ADMIN + "ExecuteReassignment": _cluster(A),
    _ADMIN + "VerifyReassignment": _cluster(DESC),
    _ADMIN + "CancelReassignment": _cluster(A),
    _ADMIN + "DecommissionBroker": _cluster(A),
    _ADMIN + "DecommissionProgress": _cluster(DESC),
    _ADMIN + "ElectPreferredLeaders": _cluster(A),
    "/grpc.health.v1.Health/Check": OPEN,
    "/grpc.health.v1.Health/Watch": OPEN,
}
"""The access each gRPC method needs, by full method name (module docstring)."""
