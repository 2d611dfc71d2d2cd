"""The one translation of a broker's lower-layer exceptions into tidelog's domain errors.

Storage raises its own exceptions (:mod:`tidelog.storage.errors`) and knows nothing of error codes; the
protocol layer (:mod:`tidelog.protocol.errors`) knows the codes and nothing of storage. A broker meets both,
so the mapping lives here, once, and every boundary that answers a peer uses it: the gRPC services, the wire
sessions and the transactional appends that fail a commit (httpx maps its transport's exceptions the same
way, in one place). The client needs only the protocol's part, :func:`~tidelog.protocol.errors.error_from_exception`.
"""

from __future__ import annotations

import errno

from tidelog.protocol.errors import (
    CorruptDataError,
    DiskFullError,
    EncryptionError,
    IncorrectOffsetError,
    InvalidArgumentError,
    MessageTooLargeError,
    OffsetDamagedError,
    OffsetOutOfRangeError,
    TidelogError,
    UnavailableError,
    error_from_exception,
)
from tidelog.protocol.messages import ErrorBody
from tidelog.protocol.records import errors as records_errors
from tidelog.storage import errors as storage_errors


def as_tidelog_error(exc: BaseException) -> TidelogError:
    """Translate any exception reaching a protocol boundary into the domain error to answer with.

    Storage errors keep their meaning, a full disk is DISK_FULL, and the rest is the protocol's generic
    translation (a protocol violation is the peer's bad input, a timeout a TIMEOUT, anything else INTERNAL).
    """
    if isinstance(exc, TidelogError):
        return exc
    if isinstance(exc, storage_errors.OffsetOutOfRangeError):
        return OffsetOutOfRangeError(str(exc))
    if isinstance(exc, storage_errors.OffsetDamagedError):
        if exc.repairing:  # a replica's copy is on its way: retry, do not skip
            return UnavailableError(f"offsets {exc.first}..{exc.last} are being restored from a replica")
        return OffsetDamagedError(str(exc), first=exc.first, last=exc.last)
    if isinstance(
        exc, records_errors.CorruptBatchError | storage_errors.CorruptSegmentError | storage_errors.CheckpointError
    ):
        return CorruptDataError(str(exc))
    if isinstance(exc, records_errors.RecordTooLargeError):
        return MessageTooLargeError(str(exc))
    if isinstance(exc, records_errors.InvalidBatchError):
        return InvalidArgumentError(str(exc))
    if isinstance(exc, storage_errors.OffsetMismatchError):
        return IncorrectOffsetError(str(exc))
    if isinstance(exc, storage_errors.DiskFullError):
        return DiskFullError(str(exc))
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(f"the broker's disk is full ({exc}): writes resume once space is freed")
    if isinstance(exc, storage_errors.KeyUnavailableError):
        return EncryptionError(str(exc))
    if isinstance(exc, storage_errors.LogClosedError):
        return UnavailableError(str(exc) or "the partition's log is closed")
    return error_from_exception(exc)


def to_error_body(exc: BaseException) -> ErrorBody:
    """The ``ErrorBody`` to send for ``exc`` (see :func:`as_tidelog_error`)."""
    return as_tidelog_error(exc).to_error_body()
