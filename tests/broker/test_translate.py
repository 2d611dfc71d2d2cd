"""The one translation of lower layers' exceptions (storage, protocol, generic) into domain errors."""

from __future__ import annotations

import errno

import grpc
import pytest

from tidelog.broker.translate import as_tidelog_error, to_error_body
from tidelog.protocol.errors import ErrorCode, NotLeaderError
from tidelog.protocol.frames import FrameError, Kind, ProtocolError
from tidelog.protocol.message_codec import UnsupportedOpError
from tidelog.protocol.messages import ErrorBody
from tidelog.protocol.records import errors as records_errors
from tidelog.storage import errors as storage_errors


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (UnsupportedOpError(Kind.REQUEST, 99), ErrorCode.UNSUPPORTED),
        (ProtocolError("bad header"), ErrorCode.INVALID_ARGUMENT),
        (FrameError("bad frame"), ErrorCode.INVALID_ARGUMENT),
        (storage_errors.OffsetOutOfRangeError(9, 0, 5), ErrorCode.OFFSET_OUT_OF_RANGE),
        (records_errors.CorruptBatchError("crc mismatch", position=4), ErrorCode.CORRUPT_DATA),
        (storage_errors.CorruptSegmentError("x.log", 1, 2, "crc"), ErrorCode.CORRUPT_DATA),
        (storage_errors.CheckpointError("hw-checkpoint", "bad magic"), ErrorCode.CORRUPT_DATA),
        (records_errors.InvalidBatchError("empty batch"), ErrorCode.INVALID_ARGUMENT),
        (records_errors.RecordTooLargeError("record 3 is 2 MiB"), ErrorCode.MESSAGE_TOO_LARGE),
        (storage_errors.LogClosedError(), ErrorCode.UNAVAILABLE),
        (TimeoutError(), ErrorCode.TIMEOUT),
        (RuntimeError("boom"), ErrorCode.INTERNAL),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else "",
)
def test_lower_layer_exceptions_translate_at_the_boundary(exc: BaseException, code: ErrorCode) -> None:
    translated = as_tidelog_error(exc)
    assert translated.code is code and translated.message
    assert to_error_body(exc).code == code


def test_a_tidelog_error_translates_to_itself() -> None:
    error = NotLeaderError("b2 leads")
    assert as_tidelog_error(error) is error
    assert to_error_body(error) == ErrorBody(int(ErrorCode.NOT_LEADER), "b2 leads", True)
    assert "RuntimeError: boom" in as_tidelog_error(RuntimeError("boom")).message


def test_a_full_disk_is_a_retriable_resource_exhausted_that_says_so() -> None:
    for raised in (
        OSError(errno.ENOSPC, "No space left on device"),
        OSError(errno.EDQUOT, "Disk quota exceeded"),
        storage_errors.DiskFullError("the disk is full: the write was refused; writes resume once space is freed"),
    ):
        error = as_tidelog_error(raised)
        assert error.code is ErrorCode.DISK_FULL and error.retriable
        assert error.grpc_status is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "disk is full" in error.message and "once space is freed" in error.message
    assert as_tidelog_error(OSError(errno.EIO, "Input/output error")).code is ErrorCode.INTERNAL
