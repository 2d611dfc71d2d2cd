"""The error table: one row and one class per code, stable numbers, the gRPC mapping, and wire round trips."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.protocol.errors import (
    MAX_STATUS_DETAILS_BYTES,
    SPECS,
    ErrorCode,
    InternalError,
    LiftbridgeAckError,
    LiftbridgeAsyncCode,
    NotLeaderError,
    TidelogError,
    error_class,
    error_from_exception,
    from_error_body,
    grpc_status,
    make_error,
    status_details,
)
from tidelog.protocol.frames import FrameDecoder, FrameError, Kind, Op, ProtocolError
from tidelog.protocol.message_codec import UnsupportedOpError, decode_frame_header, encode_error
from tidelog.protocol.messages import ErrorBody

# The wire numbers are a contract with every deployed client: this copy fails loudly if one is renumbered.
STABLE_NUMBERS = {
    "UNKNOWN_STREAM": 1,
    "UNKNOWN_PARTITION": 2,
    "STREAM_EXISTS": 3,
    "NOT_LEADER": 4,
    "READONLY": 5,
    "INVALID_ARGUMENT": 6,
    "MESSAGE_TOO_LARGE": 7,
    "TIMEOUT": 8,
    "NOT_ENOUGH_REPLICAS": 9,
    "OFFSET_OUT_OF_RANGE": 10,
    "INCORRECT_OFFSET": 11,
    "CORRUPT_DATA": 12,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "STOP_REACHED": 15,
    "FENCED_LEADER_EPOCH": 16,
    "UNSUPPORTED": 17,
    "PERMISSION_DENIED": 18,
    "UNKNOWN_GROUP": 19,
    "STALE_GROUP_EPOCH": 20,
    "OUT_OF_ORDER_SEQUENCE": 21,
    "PRODUCER_FENCED": 22,
    "UNKNOWN_PRODUCER": 23,
    "DUPLICATE_IN_FLIGHT": 24,
    "REGISTER_MISMATCH": 25,
    "APPEND_TOO_SLOW": 26,
    "PARTITION_SUSPENDED": 27,
    "DISK_FULL": 28,
    "OPEN_APPENDS_LIMIT": 29,
    "OFFSET_DAMAGED": 30,
    "NOT_COORDINATOR": 31,
    "UNKNOWN_MEMBER": 32,
    "GROUP_REFUSED": 33,
    "ENCRYPTION": 34,
    "PARTITION_PAUSED": 35,
}

S = grpc.StatusCode
EXPECTED_STATUS = {
    ErrorCode.UNKNOWN_STREAM: S.NOT_FOUND,
    ErrorCode.STREAM_EXISTS: S.ALREADY_EXISTS,
    ErrorCode.NOT_LEADER: S.FAILED_PRECONDITION,
    ErrorCode.READONLY: S.FAILED_PRECONDITION,
    ErrorCode.INVALID_ARGUMENT: S.INVALID_ARGUMENT,
    ErrorCode.MESSAGE_TOO_LARGE: S.INVALID_ARGUMENT,
    ErrorCode.TIMEOUT: S.DEADLINE_EXCEEDED,
    ErrorCode.NOT_ENOUGH_REPLICAS: S.UNAVAILABLE,
    ErrorCode.OFFSET_OUT_OF_RANGE: S.OUT_OF_RANGE,
    ErrorCode.INCORRECT_OFFSET: S.ABORTED,
    ErrorCode.CORRUPT_DATA: S.DATA_LOSS,
    ErrorCode.INTERNAL: S.INTERNAL,
    ErrorCode.UNAVAILABLE: S.UNAVAILABLE,
    ErrorCode.STOP_REACHED: S.RESOURCE_EXHAUSTED,
    ErrorCode.OUT_OF_ORDER_SEQUENCE: S.ABORTED,
    ErrorCode.PRODUCER_FENCED: S.FAILED_PRECONDITION,
    ErrorCode.UNKNOWN_PRODUCER: S.FAILED_PRECONDITION,
    ErrorCode.DUPLICATE_IN_FLIGHT: S.UNAVAILABLE,
    ErrorCode.REGISTER_MISMATCH: S.ABORTED,
    ErrorCode.APPEND_TOO_SLOW: S.ABORTED,
    ErrorCode.PARTITION_SUSPENDED: S.FAILED_PRECONDITION,
    ErrorCode.DISK_FULL: S.RESOURCE_EXHAUSTED,
    ErrorCode.OPEN_APPENDS_LIMIT: S.RESOURCE_EXHAUSTED,
    ErrorCode.OFFSET_DAMAGED: S.DATA_LOSS,
    ErrorCode.NOT_COORDINATOR: S.FAILED_PRECONDITION,
    ErrorCode.UNKNOWN_MEMBER: S.FAILED_PRECONDITION,
    ErrorCode.GROUP_REFUSED: S.FAILED_PRECONDITION,
    ErrorCode.ENCRYPTION: S.FAILED_PRECONDITION,
    ErrorCode.PARTITION_PAUSED: S.FAILED_PRECONDITION,
}
RETRIABLE = {
    ErrorCode.NOT_LEADER,
    ErrorCode.TIMEOUT,
    ErrorCode.NOT_ENOUGH_REPLICAS,
    ErrorCode.UNAVAILABLE,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.STALE_GROUP_EPOCH,
    ErrorCode.DUPLICATE_IN_FLIGHT,
    ErrorCode.DISK_FULL,
    ErrorCode.NOT_COORDINATOR,
}


def test_wire_numbers_are_stable() -> None:
    assert {code.name: int(code) for code in ErrorCode} == STABLE_NUMBERS
    assert 0 not in {int(code) for code in ErrorCode}


def test_every_code_has_exactly_one_row_and_one_grpc_status() -> None:
    assert list(SPECS) == list(ErrorCode)
    for code, spec in SPECS.items():
        assert spec.code is code
        assert isinstance(spec.grpc_status, grpc.StatusCode) and spec.grpc_status is not S.OK
        assert grpc_status(code) is spec.grpc_status
        assert isinstance(spec.async_code, LiftbridgeAsyncCode) and isinstance(spec.ack_error, LiftbridgeAckError)
        assert spec.ack_error is not LiftbridgeAckError.OK
        assert spec.message


@pytest.mark.parametrize(("code", "status"), EXPECTED_STATUS.items(), ids=lambda v: getattr(v, "name", ""))
def test_liftbridge_compatible_statuses(code: ErrorCode, status: grpc.StatusCode) -> None:
    assert grpc_status(code) is status


def test_retriable_flags() -> None:
    assert {code for code, spec in SPECS.items() if spec.retriable} == RETRIABLE


def test_liftbridge_publish_codes_where_liftbridge_has_them() -> None:
    assert SPECS[ErrorCode.INCORRECT_OFFSET].async_code is LiftbridgeAsyncCode.INCORRECT_OFFSET
    assert SPECS[ErrorCode.INCORRECT_OFFSET].ack_error is LiftbridgeAckError.INCORRECT_OFFSET
    assert SPECS[ErrorCode.MESSAGE_TOO_LARGE].ack_error is LiftbridgeAckError.TOO_LARGE
    assert SPECS[ErrorCode.READONLY].async_code is LiftbridgeAsyncCode.READONLY
    assert SPECS[ErrorCode.UNKNOWN_STREAM].async_code is LiftbridgeAsyncCode.NOT_FOUND
    assert SPECS[ErrorCode.PERMISSION_DENIED].async_code is LiftbridgeAsyncCode.PERMISSION_DENIED


def test_one_class_per_code() -> None:
    classes = [error_class(code) for code in ErrorCode]
    assert len(set(classes)) == len(classes)
    for code, cls in zip(ErrorCode, classes, strict=True):
        assert cls.code is code and issubclass(cls, TidelogError)
        assert cls.__doc__, f"{cls.__name__} needs a docstring"


def test_a_second_class_for_a_code_is_refused() -> None:
    with pytest.raises(TypeError, match="NOT_LEADER already has NotLeaderError"):

        class Again(TidelogError, code=ErrorCode.NOT_LEADER):
            pass


def test_the_base_class_is_not_raised_directly() -> None:
    with pytest.raises(TypeError, match="make_error"):
        TidelogError("what code?")


def test_subclasses_of_bound_classes_keep_the_code() -> None:
    class StaleLeaderHint(NotLeaderError):
        pass

    assert StaleLeaderHint().code is ErrorCode.NOT_LEADER


def test_defaults_and_attributes() -> None:
    error = NotLeaderError()
    assert (error.message, error.retriable, error.grpc_status) == (
        "this broker is not the partition leader",
        True,
        S.FAILED_PRECONDITION,
    )
    assert str(error) == error.message
    assert "NOT_LEADER" in repr(error)
    assert NotLeaderError("leader is b2", retriable=False).retriable is False


@pytest.mark.parametrize("code", list(ErrorCode), ids=lambda c: c.name)
def test_every_error_round_trips_through_an_error_frame(code: ErrorCode) -> None:
    sent = make_error(code, f"details of {code.name}")
    (frame,) = FrameDecoder().feed(b"".join(encode_error(3, Op.PRODUCE, sent.to_error_body())))
    body = decode_frame_header(frame)
    assert isinstance(body, ErrorBody)
    received = from_error_body(body)
    assert type(received) is type(sent)
    assert (received.code, received.message, received.retriable) == (code, sent.message, sent.retriable)


@given(code=st.integers(0, 2**31 - 1), message=st.text(max_size=20), retriable=st.booleans())
def test_any_error_body_becomes_a_tidelog_error(code: int, message: str, retriable: bool) -> None:
    error = from_error_body(ErrorBody(code, message, retriable))
    assert error.retriable is retriable
    if code in STABLE_NUMBERS.values():
        assert error.code == code
    else:
        assert isinstance(error, InternalError) and f"unknown error code {code}" in error.message


def test_an_empty_message_on_the_wire_means_the_default() -> None:
    assert from_error_body(ErrorBody(int(ErrorCode.UNKNOWN_STREAM))).message == "no such stream"


def test_status_details_are_cut_with_a_marker() -> None:
    assert status_details("short") == "short"
    for text in ("x" * 100_000, "é" * 50_000):
        cut = status_details(text)
        assert len(cut.encode()) <= MAX_STATUS_DETAILS_BYTES and cut.endswith("more bytes cut]")


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (UnsupportedOpError(Kind.REQUEST, 99), ErrorCode.UNSUPPORTED),
        (ProtocolError("bad header"), ErrorCode.INVALID_ARGUMENT),
        (FrameError("bad frame"), ErrorCode.INVALID_ARGUMENT),
        (TimeoutError(), ErrorCode.TIMEOUT),
        (RuntimeError("boom"), ErrorCode.INTERNAL),
        (NotLeaderError("b2 leads"), ErrorCode.NOT_LEADER),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else "",
)
def test_generic_exceptions_become_domain_errors(exc: BaseException, code: ErrorCode) -> None:
    translated = error_from_exception(exc)
    assert translated.code is code and translated.message
