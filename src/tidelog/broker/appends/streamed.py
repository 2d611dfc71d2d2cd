"""The transactional appends a connection has begun and not yet committed or aborted.

Both protocols drive appends through these objects: the wire protocol's APPEND frames
(:mod:`tidelog.api.wire.append`) and the gRPC ``tidelog.v1`` Append stream. An append belongs to the connection
that began it: when the connection goes away, :meth:`ConnectionAppends.abort_all` drops everything it had not
committed, and nothing of it was ever written.

An append's outcome is decided once and then repeated: a failure while it streams (an expectation that already
fails, a malformed chunk, a client below the minimum rate) is remembered, the spool is dropped at once, later
chunks are ignored, and the commit answers with that failure. A client can therefore pipeline a whole append
without waiting for any answer but the last.

Flow control (issue 5, "so one slow writer cannot stall a partition"): every ``window`` seconds an append must
have received ``min_rate × window`` bytes since the last check, or it fails with APPEND_TOO_SLOW. The write
turn is taken only at commit (:mod:`tidelog.broker.appends.commit`), so a slow append never holds up other
writers; the minimum rate bounds how long a broker holds spool space for a client that stalls.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from tidelog.broker.appends.commit import AppendRefused, Committed, Expectations, committer_of
from tidelog.broker.appends.spool import AppendSpool, AppendTooLargeError, Declared
from tidelog.broker.partitions.partition import Partition
from tidelog.broker.partitions.write_path import WriteRefused
from tidelog.broker.translate import as_tidelog_error
from tidelog.protocol.errors import ErrorCode, InvalidArgumentError, OpenAppendsLimitError, TidelogError
from tidelog.protocol.labels import EMPTY, LabelSet
from tidelog.protocol.messages import Acks
from tidelog.protocol.records.errors import CorruptBatchError, InvalidBatchError, RecordTooLargeError
from tidelog.storage.batch_check import ProduceLimits


@dataclass(frozen=True, slots=True)
class AppendLimits:
    """The broker's limits for transactional appends (from its configuration)."""

    spool_directory: Path
    max_bytes: int
    min_rate_bytes: int  # per second; 0: no minimum
    window: float  # seconds
    records: ProduceLimits  # what each record may be, as in a produced batch
    max_open: int = 64  # uncommitted appends per connection
    max_open_bytes: int = 512 * 1024 * 1024  # their spooled record bytes together, per connection


class OpenAppend:
    """One open append: streamed in chunks between its beginning and its commit or abort (the commit itself is
    :class:`~tidelog.broker.appends.commit.AppendCommitter`'s)."""

    def __init__(
        self,
        append_id: int,
        partition: Partition,
        expectations: Expectations,
        first_timestamp: int,
        acks: Acks,
        timeout: float,
        limits: AppendLimits,
    ) -> None:
        self.append_id = append_id
        self.partition = partition
        self.expectations = expectations
        self.acks = acks
        self.timeout = timeout
        self._limits = limits
        self._spool = AppendSpool(
            limits.spool_directory, first_timestamp, limits.max_bytes, limits.records, partition.clock
        )
        self.failure: AppendRefused | None = None
        # Resolved once the outcome is a failure: a protocol waiting for the client's next message can stop
        # waiting (gRPC answers a stalled client APPEND_TOO_SLOW when the rate check fails, not when it sends).
        self.failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._bytes_at_check = 0
        self._timer: asyncio.TimerHandle | None = None
        if limits.min_rate_bytes:
            self._timer = asyncio.get_running_loop().call_later(limits.window, self._check_rate)

    def precheck(self) -> None:
        """Check the expectations now, so that a client learns of a failure before it streams everything."""

        refused = committer_of(self.partition).precheck(self.expectations)
        if refused is not None:
            self.fail(refused)

    def add(self, chunk: memoryview, declared: Declared | None = None) -> None:
        """Take the next chunk of records (synchronously: chunks are spooled in the order they arrive)."""
        if self.failure is not None or not chunk:
            return
        try:
            self._spool.add(chunk, declared)
        except RecordTooLargeError as exc:
            self.fail(AppendRefused(ErrorCode.MESSAGE_TOO_LARGE, f"append {self.append_id}: {exc}", -1, EMPTY))
        except (CorruptBatchError, InvalidBatchError) as exc:  # the client's records: nothing is stored
            self.fail(AppendRefused(ErrorCode.INVALID_ARGUMENT, f"append {self.append_id}: {exc}", -1, EMPTY))
        except AppendTooLargeError as exc:
            self.fail(AppendRefused(ErrorCode.MESSAGE_TOO_LARGE, f"append {self.append_id}: {exc}", -1, EMPTY))
        except OSError as exc:  # the spool file could not be written (a full disk): nothing of it is kept
            error = as_tidelog_error(exc)
            code = error.code if error.code is ErrorCode.DISK_FULL else ErrorCode.UNAVAILABLE
            reason = error.message if code is ErrorCode.DISK_FULL else str(exc)
            self.fail(AppendRefused(code, f"append {self.append_id}: could not spool its records: {reason}", -1, EMPTY))

    @property
    def limits(self) -> AppendLimits:
        return self._limits

    @property
    def received(self) -> int:
        return self._spool.size

    def fail(self, refused: AppendRefused) -> None:
        """Decide the outcome as a failure and drop what was spooled (the first failure wins)."""
        if self.failure is None:
            self.failure = refused
        if not self.failed.done():
            self.failed.set_result(None)
        self._close()

    async def commit(self) -> Committed | AppendRefused:
        """Write the append, on the leader's write path (:meth:`AppendCommitter.commit`). Every outcome but
        success is an :class:`AppendRefused` value, also a failure (an exception) of the write; an expectation
        that failed is confirmed first, see :meth:`AppendCommitter.confirm`."""
        committer = committer_of(self.partition)
        try:
            outcome: Committed | AppendRefused | WriteRefused
            if self.failure is not None:
                outcome = self.failure
            else:
                self._cancel_timer()
                try:
                    outcome = await committer.commit(
                        self._spool, self.expectations, self.acks, self.timeout, self._limits.max_bytes
                    )
                except Exception as exc:
                    return self._refusal(as_tidelog_error(exc))
            if isinstance(outcome, WriteRefused):  # the write path's refusal becomes the append's answer here
                return self._refusal(outcome.error())
            if isinstance(outcome, AppendRefused):
                return await committer.confirm(outcome, self.timeout)
            return outcome
        finally:
            self._close()

    def abort(self) -> None:
        """Forget the append: nothing was written, no offset used."""
        self.fail(AppendRefused(ErrorCode.UNAVAILABLE, f"append {self.append_id} was aborted", -1, EMPTY))

    def _refusal(self, error: TidelogError) -> AppendRefused:
        registers: LabelSet = committer_of(self.partition).registers.latest_known()
        return AppendRefused(error.code, error.message, self.partition.log.end_offset, registers)

    def _check_rate(self) -> None:
        self._timer = None
        if self.failure is not None:
            return
        received = self._spool.size - self._bytes_at_check
        needed = self._limits.min_rate_bytes * self._limits.window
        if received < needed:
            self.fail(
                AppendRefused(
                    ErrorCode.APPEND_TOO_SLOW,
                    f"append {self.append_id} to {self.partition.name} received {received} bytes in the last "
                    f"{self._limits.window:g}s, below the minimum of {self._limits.min_rate_bytes} bytes/s "
                    "(append_min_rate_bytes); nothing was written",
                    self.partition.log.end_offset,
                    EMPTY,
                )
            )
            return
        self._bytes_at_check = self._spool.size
        self._timer = asyncio.get_running_loop().call_later(self._limits.window, self._check_rate)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _close(self) -> None:
        self._cancel_timer()
        self._spool.discard()


class ConnectionAppends:
    """The open appends of one connection, by id, within the connection's limits (``max_open`` appends,
    ``max_open_bytes`` spooled): a client cannot fill the data disk with appends it never commits."""

    def __init__(self) -> None:
        self._open: dict[int, OpenAppend] = {}

    def admit(self, append_id: int, chunk: int, limits: AppendLimits) -> None:
        """Refuse (OPEN_APPENDS_LIMIT) to begin one more append with a first chunk of ``chunk`` bytes."""
        if len(self._open) >= limits.max_open:
            raise OpenAppendsLimitError(
                f"append {append_id}: this connection has {len(self._open)} transactional appends open, the most "
                f"max_open_appends_per_connection ({limits.max_open}) allows; commit or abort one first"
            )
        self._check_bytes(append_id, chunk, limits)

    def add(self, append: OpenAppend, chunk: memoryview, declared: Declared | None = None) -> None:
        """:meth:`OpenAppend.add`, failing the append instead when the connection's spooled bytes would pass
        ``max_open_bytes`` (its spool is dropped: the space goes back at once)."""
        try:
            self._check_bytes(append.append_id, len(chunk), append.limits)
        except OpenAppendsLimitError as exc:
            append.fail(AppendRefused(exc.code, exc.message, -1, EMPTY))
            return
        append.add(chunk, declared)

    def _check_bytes(self, append_id: int, chunk: int, limits: AppendLimits) -> None:
        held = sum(each.received for each in self._open.values())
        if held + chunk > limits.max_open_bytes:
            raise OpenAppendsLimitError(
                f"append {append_id}: this connection's open transactional appends would hold {held + chunk} "
                f"bytes, above max_open_append_bytes_per_connection ({limits.max_open_bytes}); commit or abort "
                "some first"
            )

    def begin(self, append: OpenAppend) -> None:
        if append.append_id in self._open:
            append.abort()
            raise InvalidArgumentError(f"append id {append.append_id} is already open on this connection")
        self._open[append.append_id] = append

    def get(self, append_id: int) -> OpenAppend:
        found = self._open.get(append_id)
        if found is None:
            raise InvalidArgumentError(f"no open append with id {append_id} on this connection (never begun, or done)")
        return found

    def finish(self, append_id: int) -> OpenAppend:
        """Take the append out of the open set (its commit or abort follows)."""
        append = self.get(append_id)
        del self._open[append_id]
        return append

    def abort_all(self) -> None:
        """The connection is gone: every open append is dropped."""
        for append in self._open.values():
            append.abort()
        self._open.clear()

    def __len__(self) -> int:
        return len(self._open)
