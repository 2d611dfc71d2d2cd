from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Acks(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACKS_UNSPECIFIED: _ClassVar[Acks]
    ACKS_LEADER: _ClassVar[Acks]
    ACKS_ALL: _ClassVar[Acks]

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATUS_OK: _ClassVar[Status]
    STATUS_UNKNOWN_STREAM: _ClassVar[Status]
    STATUS_UNKNOWN_PARTITION: _ClassVar[Status]
    STATUS_STREAM_EXISTS: _ClassVar[Status]
    STATUS_NOT_LEADER: _ClassVar[Status]
    STATUS_READONLY: _ClassVar[Status]
    STATUS_INVALID_ARGUMENT: _ClassVar[Status]
    STATUS_MESSAGE_TOO_LARGE: _ClassVar[Status]
    STATUS_TIMEOUT: _ClassVar[Status]
    STATUS_NOT_ENOUGH_REPLICAS: _ClassVar[Status]
    STATUS_OFFSET_OUT_OF_RANGE: _ClassVar[Status]
    STATUS_INCORRECT_OFFSET: _ClassVar[Status]
    STATUS_CORRUPT_DATA: _ClassVar[Status]
    STATUS_INTERNAL: _ClassVar[Status]
    STATUS_UNAVAILABLE: _ClassVar[Status]
    STATUS_STOP_REACHED: _ClassVar[Status]
    STATUS_FENCED_LEADER_EPOCH: _ClassVar[Status]
    STATUS_UNSUPPORTED: _ClassVar[Status]
    STATUS_PERMISSION_DENIED: _ClassVar[Status]
    STATUS_UNKNOWN_GROUP: _ClassVar[Status]
    STATUS_STALE_GROUP_EPOCH: _ClassVar[Status]
    STATUS_OUT_OF_ORDER_SEQUENCE: _ClassVar[Status]
    STATUS_PRODUCER_FENCED: _ClassVar[Status]
    STATUS_UNKNOWN_PRODUCER: _ClassVar[Status]
    STATUS_DUPLICATE_IN_FLIGHT: _ClassVar[Status]
    STATUS_REGISTER_MISMATCH: _ClassVar[Status]
    STATUS_APPEND_TOO_SLOW: _ClassVar[Status]
    STATUS_PARTITION_SUSPENDED: _ClassVar[Status]
    STATUS_DISK_FULL: _ClassVar[Status]
    STATUS_OPEN_APPENDS_LIMIT: _ClassVar[Status]
    STATUS_OFFSET_DAMAGED: _ClassVar[Status]
    STATUS_NOT_COORDINATOR: _ClassVar[Status]
    STATUS_UNKNOWN_MEMBER: _ClassVar[Status]
    STATUS_GROUP_REFUSED: _ClassVar[Status]
    STATUS_ENCRYPTION: _ClassVar[Status]
    STATUS_PARTITION_PAUSED: _ClassVar[Status]
ACKS_UNSPECIFIED: Acks
ACKS_LEADER: Acks
ACKS_ALL: Acks
STATUS_OK: Status
STATUS_UNKNOWN_STREAM: Status
STATUS_UNKNOWN_PARTITION: Status
STATUS_STREAM_EXISTS: Status
STATUS_NOT_LEADER: Status
STATUS_READONLY: Status
STATUS_INVALID_ARGUMENT: Status
STATUS_MESSAGE_TOO_LARGE: Status
STATUS_TIMEOUT: Status
STATUS_NOT_ENOUGH_REPLICAS: Status
STATUS_OFFSET_OUT_OF_RANGE: Status
STATUS_INCORRECT_OFFSET: Status
STATUS_CORRUPT_DATA: Status
STATUS_INTERNAL: Status
STATUS_UNAVAILABLE: Status
STATUS_STOP_REACHED: Status
STATUS_FENCED_LEADER_EPOCH: Status
STATUS_UNSUPPORTED: Status
STATUS_PERMISSION_DENIED: Status
STATUS_UNKNOWN_GROUP: Status
STATUS_STALE_GROUP_EPOCH: Status
STATUS_OUT_OF_ORDER_SEQUENCE: Status
STATUS_PRODUCER_FENCED: Status
STATUS_UNKNOWN_PRODUCER: Status
STATUS_DUPLICATE_IN_FLIGHT: Status
STATUS_REGISTER_MISMATCH: Status
STATUS_APPEND_TOO_SLOW: Status
STATUS_PARTITION_SUSPENDED: Status
STATUS_DISK_FULL: Status
STATUS_OPEN_APPENDS_LIMIT: Status
STATUS_OFFSET_DAMAGED: Status
STATUS_NOT_COORDINATOR: Status
STATUS_UNKNOWN_MEMBER: Status
STATUS_GROUP_REFUSED: Status
STATUS_ENCRYPTION: Status
STATUS_PARTITION_PAUSED: Status

class AppendRequest(_message.Message):
    __slots__ = ("header", "records", "commit")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    header: AppendHeader
    records: _containers.RepeatedCompositeFieldContainer[Record]
    commit: bool
    def __init__(self, header: _Optional[_Union[AppendHeader, _Mapping]] = ..., records: _Optional[_Iterable[_Union[Record, _Mapping]]] = ..., commit: _Optional[bool] = ...) -> None: ...

class AppendHeader(_message.Message):
    __slots__ = ("stream", "partition", "expected_offset", "check_registers", "union_registers", "subtract_registers", "acks", "timeout_ms")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CHECK_REGISTERS_FIELD_NUMBER: _ClassVar[int]
    UNION_REGISTERS_FIELD_NUMBER: _ClassVar[int]
    SUBTRACT_REGISTERS_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    partition: int
    expected_offset: int
    check_registers: LabelSelector
    union_registers: LabelSet
    subtract_registers: LabelSet
    acks: Acks
    timeout_ms: int
    def __init__(self, stream: _Optional[str] = ..., partition: _Optional[int] = ..., expected_offset: _Optional[int] = ..., check_registers: _Optional[_Union[LabelSelector, _Mapping]] = ..., union_registers: _Optional[_Union[LabelSet, _Mapping]] = ..., subtract_registers: _Optional[_Union[LabelSet, _Mapping]] = ..., acks: _Optional[_Union[Acks, str]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class Record(_message.Message):
    __slots__ = ("key", "value", "headers", "timestamp")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    value: bytes
    headers: _containers.RepeatedCompositeFieldContainer[RecordHeader]
    timestamp: int
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., headers: _Optional[_Iterable[_Union[RecordHeader, _Mapping]]] = ..., timestamp: _Optional[int] = ...) -> None: ...

class RecordHeader(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: bytes
    def __init__(self, name: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class Label(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class LabelSet(_message.Message):
    __slots__ = ("labels",)
    LABELS_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedCompositeFieldContainer[Label]
    def __init__(self, labels: _Optional[_Iterable[_Union[Label, _Mapping]]] = ...) -> None: ...

class LabelSelector(_message.Message):
    __slots__ = ("include", "exclude")
    INCLUDE_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    include: LabelSet
    exclude: LabelSet
    def __init__(self, include: _Optional[_Union[LabelSet, _Mapping]] = ..., exclude: _Optional[_Union[LabelSet, _Mapping]] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("status", "message", "base_offset", "last_offset", "log_end", "registers")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_END_FIELD_NUMBER: _ClassVar[int]
    REGISTERS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    base_offset: int
    last_offset: int
    log_end: int
    registers: LabelSet
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., base_offset: _Optional[int] = ..., last_offset: _Optional[int] = ..., log_end: _Optional[int] = ..., registers: _Optional[_Union[LabelSet, _Mapping]] = ...) -> None: ...
