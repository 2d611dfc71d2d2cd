"""One request per wire op and per gRPC method, for the authorization tests generated from the access tables.

Each names resources of its own that do not exist (``absent-*``), so a request the ACLs let through reaches its
handler and fails there (UNKNOWN_STREAM and the like) without changing anything the other tests use. A test
fails when an op the wire server serves, or a method the gRPC server serves, has no sample here.
"""

from __future__ import annotations

from typing import Any

from tidelog.protocol._gen import api_pb2
from tidelog.protocol._gen.tidelog.v1 import admin_pb2, append_pb2
from tidelog.protocol.auth_messages import SaslFinishRequest, SaslStartRequest
from tidelog.protocol.cursor_messages import FetchCursorRequest, ListCursorsRequest, SetCursorRequest
from tidelog.protocol.frames import Op
from tidelog.protocol.group_messages import (
    DeleteGroupRequest,
    DescribeGroupRequest,
    GroupAssignmentsRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListGroupsRequest,
    ReportCoordinatorRequest,
)
from tidelog.protocol.messages import (
    AppendPhase,
    AppendRequest,
    CreateStreamRequest,
    DeleteStreamRequest,
    FetchRequest,
    InitProducerRequest,
    ListOffsetsRequest,
    ListStreamsRequest,
    MetadataRequest,
    ProduceRequest,
    ResetHeadRequest,
    SetStreamStateRequest,
    SkipDamagedRequest,
)
from tidelog.protocol.peer_messages import (
    AlterIsrRequest,
    ControlledShutdownRequest,
    EpochEndOffsetRequest,
    ReplicaFetchRequest,
    ReportUnreachableRequest,
    SegmentFetchRequest,
    SegmentListRequest,
    SuspendPartitionRequest,
)
from tidelog.protocol.reassign_messages import (
    DecommissionBrokerRequest,
    ListReassignmentsRequest,
    ReassignPartitionsRequest,
)
from tidelog.protocol.reshape_messages import AddPartitionsRequest, AlterStreamRequest, ElectLeadersRequest
from tidelog.protocol.session_messages import SessionFetchEntry, SessionFetchRequest

S = "absent-stream"
G = "absent-group"

WIRE_SAMPLES: dict[int, Any] = {
    Op.PRODUCE: ProduceRequest(S, 0, timeout_ms=2_000),
    Op.FETCH: FetchRequest(S, 0, 0, max_wait_ms=0),
    Op.APPEND: AppendRequest(1, AppendPhase.BEGIN, stream=S),
    Op.LIST_OFFSETS: ListOffsetsRequest(S, 0),
    Op.INIT_PRODUCER: InitProducerRequest(timeout_ms=2_000),
    Op.SET_CURSOR: SetCursorRequest(S, 0, "absent-cursor", 1, timeout_ms=2_000),
    Op.FETCH_CURSOR: FetchCursorRequest(S, 0, "absent-cursor", timeout_ms=2_000),
    Op.LIST_CURSORS: ListCursorsRequest("absent-cursor", 0, timeout_ms=2_000),
    Op.METADATA: MetadataRequest((S,)),
    Op.CREATE_STREAM: CreateStreamRequest("absent-created", "absent-created", timeout_ms=5_000),
    Op.DELETE_STREAM: DeleteStreamRequest(S, timeout_ms=2_000),
    Op.LIST_STREAMS: ListStreamsRequest(),
    Op.SET_STREAM_STATE: SetStreamStateRequest(S, paused=True, timeout_ms=2_000),
    Op.RESET_HEAD: ResetHeadRequest(S, 0, timeout_ms=2_000),
    Op.SKIP_DAMAGED: SkipDamagedRequest(S, 0),
    Op.ADD_PARTITIONS: AddPartitionsRequest(S, 2, timeout_ms=2_000),
    Op.ALTER_STREAM: AlterStreamRequest(S, {"retention_max_age_ms": "1000"}, timeout_ms=2_000),
    Op.ELECT_LEADERS: ElectLeadersRequest(timeout_ms=2_000),
    Op.REASSIGN_PARTITIONS: ReassignPartitionsRequest(generate=True, brokers=("absent-broker",), timeout_ms=2_000),
    Op.DECOMMISSION_BROKER: DecommissionBrokerRequest("absent-broker", timeout_ms=2_000),
    Op.LIST_REASSIGNMENTS: ListReassignmentsRequest(),
    Op.REPLICA_FETCH: ReplicaFetchRequest(S, 0, "absent-broker", 0, 0),
    Op.EPOCH_END_OFFSET: EpochEndOffsetRequest(S, 0, "absent-broker", 0),
    Op.SEGMENT_LIST: SegmentListRequest(S, 0, "absent-broker", 0, 0),
    Op.SEGMENT_FETCH: SegmentFetchRequest(S, 0, "absent-broker", 0, 0, 0),
    Op.SESSION_FETCH: SessionFetchRequest("absent-broker", (SessionFetchEntry(S, 0, 0, 0),)),
    Op.ALTER_ISR: AlterIsrRequest(S, 0, "absent-broker", 0, ("absent-broker",)),
    Op.REPORT_UNREACHABLE: ReportUnreachableRequest("absent-broker", "absent-other"),
    Op.CONTROLLED_SHUTDOWN: ControlledShutdownRequest("absent-broker"),
    Op.SUSPEND_PARTITION: SuspendPartitionRequest(S, 0, "absent-broker", 0, "test"),
    Op.JOIN_GROUP: JoinGroupRequest(G, "absent-consumer", (S,)),
    Op.LEAVE_GROUP: LeaveGroupRequest(G, "absent-consumer"),
    Op.GROUP_ASSIGNMENTS: GroupAssignmentsRequest(G, "absent-consumer", 0),
    Op.REPORT_COORDINATOR: ReportCoordinatorRequest(G, "absent-consumer", "absent-broker", 0),
    Op.DESCRIBE_GROUP: DescribeGroupRequest(G),
    Op.LIST_GROUPS: ListGroupsRequest(),
    Op.DELETE_GROUP: DeleteGroupRequest(G, 0, timeout_ms=2_000),
    Op.SASL_START: SaslStartRequest("SCRAM-SHA-256", "n,,n=absent-user,r=abc"),
    Op.SASL_FINISH: SaslFinishRequest("c=biws,r=abc,p=eA=="),
}

_API = "/proto.API/"
_ADMIN = "/tidelog.v1.Admin/"
GRPC_SAMPLES: dict[str, Any] = {
    _API + "CreateStream": api_pb2.CreateStreamRequest(subject="absent-grpc", name="absent-grpc", partitions=1),
    _API + "DeleteStream": api_pb2.DeleteStreamRequest(name=S),
    _API + "PauseStream": api_pb2.PauseStreamRequest(name=S),
    _API + "SetStreamReadonly": api_pb2.SetStreamReadonlyRequest(name=S, readonly=True),
    _API + "Subscribe": api_pb2.SubscribeRequest(stream=S),
    _API + "FetchMetadata": api_pb2.FetchMetadataRequest(streams=[S]),
    _API + "FetchPartitionMetadata": api_pb2.FetchPartitionMetadataRequest(stream=S),
    _API + "Publish": api_pb2.PublishRequest(stream=S, value=b"v"),
    _API + "PublishAsync": api_pb2.PublishRequest(stream=S, value=b"v", correlationId="c1"),
    _API + "PublishToSubject": api_pb2.PublishToSubjectRequest(subject="absent.subject", value=b"v"),
    _API + "SetCursor": api_pb2.SetCursorRequest(stream=S, cursorId="absent-cursor", offset=1),
    _API + "FetchCursor": api_pb2.FetchCursorRequest(stream=S, cursorId="absent-cursor"),
    _API + "JoinConsumerGroup": api_pb2.JoinConsumerGroupRequest(groupId=G, consumerId="c", streams=[S]),
    _API + "LeaveConsumerGroup": api_pb2.LeaveConsumerGroupRequest(groupId=G, consumerId="c"),
    _API + "FetchConsumerGroupAssignments": api_pb2.FetchConsumerGroupAssignmentsRequest(groupId=G, consumerId="c"),
    _API + "ReportConsumerGroupCoordinator": api_pb2.ReportConsumerGroupCoordinatorRequest(
        groupId=G, consumerId="c", coordinator="absent-broker"
    ),
    "/tidelog.v1.Appender/Append": append_pb2.AppendRequest(header=append_pb2.AppendHeader(stream=S), commit=True),
    _ADMIN + "AddPartitions": admin_pb2.AddPartitionsRequest(stream=S, partitions=2),
    _ADMIN + "AlterStream": admin_pb2.AlterStreamRequest(stream=S, settings={"retention_max_age_ms": "1000"}),
    _ADMIN + "GenerateReassignment": admin_pb2.GenerateReassignmentRequest(brokers=["absent-broker"]),
    _ADMIN + "ExecuteReassignment": admin_pb2.ExecuteReassignmentRequest(
        partitions=[admin_pb2.PartitionReplicas(stream=S, partition=0, replicas=["absent-broker"])]
    ),
    _ADMIN + "VerifyReassignment": admin_pb2.VerifyReassignmentRequest(),
    _ADMIN + "CancelReassignment": admin_pb2.CancelReassignmentRequest(
        partitions=[admin_pb2.PartitionRef(stream=S, partition=0)]
    ),
    _ADMIN + "DecommissionBroker": admin_pb2.DecommissionBrokerRequest(broker_id="absent-broker"),
    _ADMIN + "DecommissionProgress": admin_pb2.DecommissionProgressRequest(broker_id="absent-broker"),
    _ADMIN + "ElectPreferredLeaders": admin_pb2.ElectPreferredLeadersRequest(),
}
"""Requests of every method of proto.API and tidelog.v1 (the health service is open and tested apart)."""
