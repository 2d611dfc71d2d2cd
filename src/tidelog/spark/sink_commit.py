"""A sink task's commit: its rows for each partition in one transactional append, fenced so a repeat writes nothing.

The tasks write; the driver only checks. A task of the ``tidelog`` sink groups its rows by partition
(:mod:`~tidelog.spark.writing`), then :func:`commit_task` appends each group itself, over the wire protocol, in
one all-or-nothing append: no row passes through the driver, and the sink's throughput grows with the executors.
The message the task returns (:class:`TaskCommit`) says what it wrote; ``commit(messages, N)`` on the driver
checks the messages (:func:`check_batch`) and writes nothing.

Streaming (a :class:`~tidelog.spark.sink_fence.Fence`). Every append checks and sets the partition's registers so
that the slice of micro-batch ``N`` written by Spark task ``t`` lands once, whichever attempt of the task runs
and however often Spark replays ``N`` (:mod:`~tidelog.spark.sink_fence` decides; ``docs/design/spark-sink.md``
proves it). Per partition (:meth:`_Committer.fenced`):

1. read the registers (an append of no records);
2. the fence says SKIP: the slice is in (or a later micro-batch runs) — skip it, once the log is known to be
   committed that far (a leader reports registers that may include an append not yet replicated, and one lost
   in a failover must be written again); APPEND: append the rows with the fence's compare-and-set;
3. REGISTER_MISMATCH: another task of the same slot changed the label in between (or another attempt of this
   task wrote this slice). The refusal carries the registers, committed: decide again from them — SKIP, or
   append again against the new value. Contention is bounded (:data:`MAX_CONFLICTS`);
4. an append whose outcome is unknown (connection lost after its commit, a timeout, a failover): the
   registers will tell, so go back to 1 — a retry can never write the slice twice.

Batch writes (no fence): one plain transactional append per task and partition. All or nothing per task and
partition; see ``docs/design/spark-sink.md`` for what a failed write leaves.

Limits: one append per task and partition, at most the broker's ``max_append_bytes`` (128 MiB by default):
bound micro-batches with the source's ``maxOffsetsPerTrigger`` or spread them over more tasks.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql.datasource import WriterCommitMessage

from tidelog.client import Appender, Cluster, ConnectionClosedError, refusal_details
from tidelog.protocol.errors import RegisterMismatchError, TidelogError
from tidelog.protocol.labels import EMPTY, LabelSet
from tidelog.protocol.messages import ListOffsetsRequest, ListOffsetsResponse
from tidelog.protocol.records import EncodedRecords
from tidelog.spark.reading import _new_loop
from tidelog.spark.record_encoding import encode_rows
from tidelog.spark.sink_fence import Action, Fence, FenceError, decide
from tidelog.spark.sink_options import SinkOptions
from tidelog.spark.writing import Target, TaskRows

log = logging.getLogger(__name__)

QUERY_ID_PROPERTY = "sql.streaming.queryId"
"""The local property Spark sets on a streaming query's jobs (``StreamExecution.QUERY_ID_KEY``)."""
BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""The local property Spark sets on a micro-batch's jobs (``MicroBatchExecution.BATCH_ID_KEY``)."""

RETRY_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0)
"""Pauses between attempts at a partition whose append's outcome is unknown (the registers decide again)."""
MAX_CONFLICTS = 200
"""Refusals by another task of the same slot that one slice tolerates before the task fails."""
CONFIRM_WITHIN = 60.0
"""Seconds to wait for the log to be committed up to the registers that say a slice is there already."""


class SinkCommitError(RuntimeError):
    """A task's rows (or a micro-batch) could not be committed: a target does not exist, a register holds what
    this sink cannot have written, or the brokers refused. The task fails; Spark retries it or stops the query."""


class Outcome:
    APPENDED = "appended"
    SKIPPED = "skipped"  # a repeat: the slice was in already


@dataclass(frozen=True, slots=True)
class PartitionCommit:
    """What a task did for one partition: appended ``records`` at ``base_offset``, or skipped them."""

    stream: str
    partition: int
    records: int
    outcome: str
    base_offset: int = -1


@dataclass(frozen=True)
class TaskCommit(WriterCommitMessage):
    """A task's commit message: who it was (``query_id`` and ``batch_id`` None in a batch write) and what it did."""

    query_id: str | None
    batch_id: int | None
    task: int
    commits: tuple[PartitionCommit, ...]

    @property
    def appended(self) -> int:
        return sum(c.records for c in self.commits if c.outcome == Outcome.APPENDED)


def commit_task(options: SinkOptions, rows: TaskRows, fence: Fence | None, task: int) -> TaskCommit:
    """Append a task's rows, each partition's in one transactional append, fenced when ``fence`` is given."""
    if not rows.parts:
        return TaskCommit(rows.query_id, None if fence is None else fence.batch_id, task, ())
    loop = _new_loop()
    try:
        commits = loop.run_until_complete(_commit(options, rows, fence))
    finally:
        loop.close()
    return TaskCommit(rows.query_id, None if fence is None else fence.batch_id, task, tuple(commits))


def check_batch(messages: Sequence[WriterCommitMessage | None], batch_id: int | None) -> list[TaskCommit]:
    """The driver's commit: every task reported, for this micro-batch (``batch_id`` None: a batch write)."""
    out = []
    for message in messages:
        if not isinstance(message, TaskCommit):
            raise SinkCommitError(f"a task returned {type(message).__name__}, not the sink's TaskCommit (did it fail?)")
        if batch_id is not None and message.commits and message.batch_id != batch_id:
            raise SinkCommitError(
                f"task {message.task} wrote for micro-batch {message.batch_id} while Spark commits {batch_id} "
                f"(Spark's local property {BATCH_ID_PROPERTY})"
            )
        out.append(message)
    skipped = [f"{c.stream}/{c.partition}" for m in out for c in m.commits if c.outcome == Outcome.SKIPPED]
    if skipped:
        log.info("micro-batch %s: slices in %s were in already (a repeat): not written again", batch_id, skipped)
    return out


async def _commit(options: SinkOptions, rows: TaskRows, fence: Fence | None) -> list[PartitionCommit]:
    cluster = Cluster(list(options.brokers), ssl=options.ssl(), credentials=options.credentials)
    committer = _Committer(cluster, Appender(cluster=cluster), fence)
    try:
        await committer.check_targets(sorted((part.stream, part.partition) for part in rows.parts))
        encoded = [(part, encode_rows(part.rows)) for part in rows.parts]  # in bulk: no Python step per row
        results = await asyncio.gather(
            *(committer.commit(part.stream, part.partition, records, part.rows.num_rows) for part, records in encoded),
            return_exceptions=True,
        )
    finally:
        await cluster.close()
    failures = [result for result in results if isinstance(result, BaseException)]
    if failures:
        raise failures[0]
    return [result for result in results if isinstance(result, PartitionCommit)]


class _Committer:
    """Appends one task's slices over one cluster connection (see the module docstring)."""

    def __init__(self, cluster: Cluster, appender: Appender, fence: Fence | None) -> None:
        self.cluster = cluster
        self.appender = appender
        self.fence = fence  # None: a batch write, unfenced

    async def check_targets(self, targets: Sequence[Target]) -> None:
        """Refuse the task before writing any of it when a target stream or partition does not exist."""
        streams = sorted({stream for stream, _ in targets})
        meta = await self.cluster.metadata(streams)
        counts = {info.name: len(info.partitions) for info in meta.streams if info.error is None}
        for stream, partition in targets:
            if stream not in counts:
                raise SinkCommitError(f"rows are written to stream {stream!r}, which does not exist")
            if partition >= counts[stream]:
                raise SinkCommitError(
                    f"rows are written to partition {partition} of stream {stream!r}, which has {counts[stream]}"
                )

    async def commit(
        self, stream: str, partition: int, records: Sequence[EncodedRecords], count: int
    ) -> PartitionCommit:
        """Append ``records`` (``count`` rows, encoded), fenced when the task has a fence."""
        if self.fence is None:
            outcome = await self.appender.append(stream, partition, records)
            return PartitionCommit(stream, partition, count, Outcome.APPENDED, outcome.base_offset)
        return await self.fenced(stream, partition, records, count, self.fence)

    async def fenced(
        self, stream: str, partition: int, records: Sequence[EncodedRecords], count: int, fence: Fence
    ) -> PartitionCommit:
        """Append ``records`` unless the partition holds this slice already; see steps 1–4 of the module."""
        skipped = PartitionCommit(stream, partition, count, Outcome.SKIPPED)
        where = f"{stream}/{partition}: micro-batch {fence.batch_id} task {fence.task}"
        delays = iter(RETRY_DELAYS)
        conflicts = 0
        registers: LabelSet | None = None  # known from a refusal: no need to read them again
        while True:
            try:
                log_end = -1
                if registers is None:
                    state = await self.appender.registers(stream, partition)
                    registers, log_end = state.registers, state.log_end
                decision = decide(registers, fence)
                if decision.action is Action.SKIP:
                    if log_end >= 0:  # a refusal's registers are committed already
                        await self.confirm_committed(stream, partition, log_end)
                    return skipped
                try:
                    outcome = await self.appender.append(
                        stream,
                        partition,
                        records,
                        check_registers=decision.check,
                        union_registers=decision.mark or EMPTY,
                    )
                except RegisterMismatchError as exc:
                    details = refusal_details(exc)
                    conflicts += 1
                    if conflicts > MAX_CONFLICTS:
                        raise SinkCommitError(f"{where}: refused {conflicts} times by other tasks") from exc
                    registers = details.registers if details is not None else None
                    await asyncio.sleep(random.uniform(0, 0.002 * min(conflicts, 50)))
                    continue
                return PartitionCommit(stream, partition, count, Outcome.APPENDED, outcome.base_offset)
            except FenceError as exc:
                raise SinkCommitError(f"{where}: {exc}") from exc
            except (ConnectionClosedError, TidelogError) as exc:
                if isinstance(exc, TidelogError) and not exc.retriable:
                    raise SinkCommitError(f"{where}: {exc}") from exc
                delay = next(delays, None)
                if delay is None:
                    raise SinkCommitError(f"{where}: gave up: {exc}") from exc
                log.warning("%s: %s; reading the registers again", where, exc)
                registers = None
                self.cluster.forget(stream)
                await asyncio.sleep(delay)

    async def confirm_committed(self, stream: str, partition: int, log_end: int) -> None:
        """Wait until the partition's high watermark reaches ``log_end``: what the registers said is committed."""
        deadline = time.monotonic() + CONFIRM_WITHIN
        while (high_watermark := (await self._offsets(stream, partition)).high_watermark) < log_end:
            if time.monotonic() > deadline:
                raise SinkCommitError(
                    f"{stream}/{partition}: its registers say this slice is there, but the log is committed only "
                    f"to {high_watermark} of {log_end} after {CONFIRM_WITHIN:.0f} s"
                )
            await asyncio.sleep(0.05)

    async def _offsets(self, stream: str, partition: int) -> ListOffsetsResponse:
        response = await self.cluster.leader_request(stream, partition, ListOffsetsRequest(stream, partition))
        assert isinstance(response.header, ListOffsetsResponse)
        return response.header
