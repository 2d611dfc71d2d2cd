from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AddPartitionsRequest(_message.Message):
    __slots__ = ("stream", "partitions")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    partitions: int
    def __init__(self, stream: _Optional[str] = ..., partitions: _Optional[int] = ...) -> None: ...

class AddPartitionsResponse(_message.Message):
    __slots__ = ("before", "after")
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    before: int
    after: int
    def __init__(self, before: _Optional[int] = ..., after: _Optional[int] = ...) -> None: ...

class AlterStreamRequest(_message.Message):
    __slots__ = ("stream", "settings")
    class SettingsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    settings: _containers.ScalarMap[str, str]
    def __init__(self, stream: _Optional[str] = ..., settings: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SettingChange(_message.Message):
    __slots__ = ("name", "before", "after")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    name: str
    before: str
    after: str
    def __init__(self, name: _Optional[str] = ..., before: _Optional[str] = ..., after: _Optional[str] = ...) -> None: ...

class AlterStreamResponse(_message.Message):
    __slots__ = ("changes",)
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[SettingChange]
    def __init__(self, changes: _Optional[_Iterable[_Union[SettingChange, _Mapping]]] = ...) -> None: ...

class PartitionReplicas(_message.Message):
    __slots__ = ("stream", "partition", "replicas")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    partition: int
    replicas: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, stream: _Optional[str] = ..., partition: _Optional[int] = ..., replicas: _Optional[_Iterable[str]] = ...) -> None: ...

class PartitionRef(_message.Message):
    __slots__ = ("stream", "partition")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    stream: str
    partition: int
    def __init__(self, stream: _Optional[str] = ..., partition: _Optional[int] = ...) -> None: ...

class GenerateReassignmentRequest(_message.Message):
    __slots__ = ("brokers", "streams")
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    brokers: _containers.RepeatedScalarFieldContainer[str]
    streams: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, brokers: _Optional[_Iterable[str]] = ..., streams: _Optional[_Iterable[str]] = ...) -> None: ...

class ExecuteReassignmentRequest(_message.Message):
    __slots__ = ("partitions", "throttle_bps")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_BPS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionReplicas]
    throttle_bps: int
    def __init__(self, partitions: _Optional[_Iterable[_Union[PartitionReplicas, _Mapping]]] = ..., throttle_bps: _Optional[int] = ...) -> None: ...

class VerifyReassignmentRequest(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionReplicas]
    def __init__(self, partitions: _Optional[_Iterable[_Union[PartitionReplicas, _Mapping]]] = ...) -> None: ...

class CancelReassignmentRequest(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionRef]
    def __init__(self, partitions: _Optional[_Iterable[_Union[PartitionRef, _Mapping]]] = ...) -> None: ...

class DecommissionBrokerRequest(_message.Message):
    __slots__ = ("broker_id", "throttle_bps")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_BPS_FIELD_NUMBER: _ClassVar[int]
    broker_id: str
    throttle_bps: int
    def __init__(self, broker_id: _Optional[str] = ..., throttle_bps: _Optional[int] = ...) -> None: ...

class DecommissionProgressRequest(_message.Message):
    __slots__ = ("broker_id",)
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    broker_id: str
    def __init__(self, broker_id: _Optional[str] = ...) -> None: ...

class PartitionMove(_message.Message):
    __slots__ = ("stream", "partition", "current", "proposed", "note")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    stream: str
    partition: int
    current: _containers.RepeatedScalarFieldContainer[str]
    proposed: _containers.RepeatedScalarFieldContainer[str]
    note: str
    def __init__(self, stream: _Optional[str] = ..., partition: _Optional[int] = ..., current: _Optional[_Iterable[str]] = ..., proposed: _Optional[_Iterable[str]] = ..., note: _Optional[str] = ...) -> None: ...

class ReassignmentMoves(_message.Message):
    __slots__ = ("moves",)
    MOVES_FIELD_NUMBER: _ClassVar[int]
    moves: _containers.RepeatedCompositeFieldContainer[PartitionMove]
    def __init__(self, moves: _Optional[_Iterable[_Union[PartitionMove, _Mapping]]] = ...) -> None: ...

class ReassignmentStatus(_message.Message):
    __slots__ = ("stream", "partition", "replicas", "target", "isr", "leader", "state", "detail", "throttle_bps")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_BPS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    partition: int
    replicas: _containers.RepeatedScalarFieldContainer[str]
    target: _containers.RepeatedScalarFieldContainer[str]
    isr: _containers.RepeatedScalarFieldContainer[str]
    leader: str
    state: str
    detail: str
    throttle_bps: int
    def __init__(self, stream: _Optional[str] = ..., partition: _Optional[int] = ..., replicas: _Optional[_Iterable[str]] = ..., target: _Optional[_Iterable[str]] = ..., isr: _Optional[_Iterable[str]] = ..., leader: _Optional[str] = ..., state: _Optional[str] = ..., detail: _Optional[str] = ..., throttle_bps: _Optional[int] = ...) -> None: ...

class ReassignmentStatuses(_message.Message):
    __slots__ = ("statuses", "replicas_left")
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_LEFT_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedCompositeFieldContainer[ReassignmentStatus]
    replicas_left: int
    def __init__(self, statuses: _Optional[_Iterable[_Union[ReassignmentStatus, _Mapping]]] = ..., replicas_left: _Optional[int] = ...) -> None: ...

class ElectPreferredLeadersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ElectPreferredLeadersResponse(_message.Message):
    __slots__ = ("moved", "not_preferred")
    MOVED_FIELD_NUMBER: _ClassVar[int]
    NOT_PREFERRED_FIELD_NUMBER: _ClassVar[int]
    moved: int
    not_preferred: int
    def __init__(self, moved: _Optional[int] = ..., not_preferred: _Optional[int] = ...) -> None: ...
