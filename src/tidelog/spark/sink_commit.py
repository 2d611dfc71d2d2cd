"""The driver's commit: a micro-batch becomes one transactional append per partition, written at most once.

Spark's contract with a sink: micro-batch ``N`` of a query may be handed to it more than once — replayed after
the driver died between the sink's commit and Spark's own commit log entry, or rerun after a failure — and the
sink must make the repeats write nothing. Spark runs ``commit(messages, N)`` on the driver once every task of the
batch has succeeded; the tasks return their rows instead of appending them (:mod:`~tidelog.spark.writing`), so
all the batch's rows for a partition reach one place, and become one all-or-nothing append guarded by a
*register* (:mod:`tidelog.protocol.labels`).

The register. Label ``spark.<query id>`` on a partition holds the last batch id the query appended to it. The
query id is Spark's ``StreamingQuery.id``: Spark keeps it in the checkpoint (its ``metadata`` file), so it is the
same after every restart from that checkpoint and new for a new checkpoint — where a path would wrongly carry
the batch ids of a deleted checkpoint over to its replacement, whose batch ids start again at 0. Delta Lake's
sink keys its idempotent commits on the same id. The tasks read it from their local properties
(:data:`QUERY_ID_PROPERTY`) and put it in their messages: the sink's options do not carry it.

Per partition (:func:`decide`, :meth:`_Committer.guarded`):

1. read the registers (an append of no records);
2. the label holds ``N`` or more: the partition has this batch already (a replay) — skip it, once the log is
   known to be committed that far (a leader reports registers that may include an append not yet replicated;
   one lost in a failover must be written again). Otherwise append the rows, checking that the label still
   holds what was read (``include spark.<id>=<seen>``, or ``exclude spark.<id>`` when absent) and setting it
   to ``N`` (``union``): a compare-and-set that lands only on the state the decision was made on;
3. REGISTER_MISMATCH: another writer changed the label in between — a zombie driver of the same query running
   the same batch. The refusal carries the registers, committed: ``N`` or more means that writer wrote this
   batch, skip; anything else fails the commit loudly (:class:`SinkCommitError`);
4. an append whose outcome is unknown (connection lost after its commit, a timeout, a failover): the register
   will tell, so go back to 1 — a retry can never write the batch twice.

What it costs, and the limits:

- **Rows go through the driver.** Every row is pickled by a task, carried by Spark to the driver and encoded
  there by one Python process: the sink's throughput is that of one core (see ``sink_rows`` in
  ``benchmarks/spark.py``), and a micro-batch must fit in the driver's memory and in Spark's
  ``spark.driver.maxResultSize`` (1 GiB by default: the messages are task results). Bound micro-batches with
  the source's ``maxOffsetsPerTrigger``. (An appender that accepted records encoded by the tasks would let them
  share the encoding.)
- **One append per partition per micro-batch**, at most the broker's ``max_append_bytes`` (128 MiB by
  default); an empty partition writes nothing.
- **All or nothing per partition, not across partitions.** Partitions commit concurrently; if the driver dies
  in between, readers see some partitions with batch ``N`` before the replay writes the others. The replay
  writes the rows it routes to the others, so it must route them as the first run did: Spark's exactly once
  already requires a replayable source and a deterministic query, and the tasks route deterministically.
- **One label per query per partition, for ever.** Registers change only with an append that has records, so a
  finished query's label stays; a partition holds at most 64 labels (shared with any other use of registers).
  Each new checkpoint that writes a partition takes one more: when they run out, commits fail with the broker's
  INVALID_ARGUMENT naming the limit.

Batch writes (``df.write``) are never replayed by Spark: one plain append per partition, no register (a label
per write would use up the 64). A write that fails during its commit may have written some partitions; running
it again writes those again.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from tidelog.client import Appender, Cluster, ConnectionClosedError, NewRecord, refusal_details
from tidelog.client.appender import RecordLike
from tidelog.protocol.errors import RegisterMismatchError, TidelogError
from tidelog.protocol.labels import EMPTY, LabelSelector, LabelSet
from tidelog.protocol.messages import ListOffsetsRequest, ListOffsetsResponse
from tidelog.spark.reading import _new_loop
from tidelog.spark.sink_options import SinkOptions
from tidelog.spark.writing import Target, TaskRows

log = logging.getLogger(__name__)

REGISTER_PREFIX = "spark."
QUERY_ID_PROPERTY = "sql.streaming.queryId"
"""The local property Spark sets on a streaming query's jobs (``StreamExecution.QUERY_ID_KEY``)."""

RETRY_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0)
"""Pauses between attempts at a partition whose append's outcome is unknown (the register decides again)."""
CONFIRM_WITHIN = 60.0
"""Seconds to wait for the log to be committed up to the registers that say a batch is there already."""


class SinkCommitError(RuntimeError):
    """A micro-batch (or write) could not be committed: another writer moved a register, a target does not
    exist, or the brokers refused. The batch fails; Spark retries it or stops the query."""


class Action(enum.Enum):
    """What a partition's registers say to do with a batch's rows for it."""

    APPEND = "append"  # the batch is not there: append it, with the check of the decision
    SKIP = "skip"  # the partition holds this batch (or a later one) already: a replay


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    seen: int | None  # the batch id the label held; None: no label yet
    check: LabelSelector | None  # for APPEND: the registers must still be as seen


class Outcome(enum.Enum):
    APPENDED = "appended"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class PartitionCommit:
    """What the commit did for one partition: appended ``records`` at ``base_offset``, or skipped them."""

    stream: str
    partition: int
    records: int
    outcome: Outcome
    base_offset: int = -1


def register_name(query_id: str) -> str:
    """The label that records which batches of query ``query_id`` a partition holds."""
    return REGISTER_PREFIX + query_id


def batch_of(registers: LabelSet, name: str) -> int | None:
    """The batch id label ``name`` holds, or None without one; a value this sink cannot have written fails."""
    values = registers.values_of(name)
    if not values:
        return None
    if len(values) > 1 or not values[0].isdigit():
        raise SinkCommitError(f"register {name} holds {', '.join(values)}, not one batch id: not written by this sink")
    return int(values[0])


def decide(registers: LabelSet, name: str, batch_id: int) -> Decision:
    """Whether batch ``batch_id`` must still be appended to a partition whose registers are ``registers``."""
    seen = batch_of(registers, name)
    if seen is not None and seen >= batch_id:
        return Decision(Action.SKIP, seen, None)
    if seen is None:
        check = LabelSelector(exclude=LabelSet.of((name, "")))  # an empty value excludes the name altogether
    else:
        check = LabelSelector(include=LabelSet.of((name, str(seen))))
    return Decision(Action.APPEND, seen, check)


def commit_stream_batch(options: SinkOptions, messages: Sequence[object], batch_id: int) -> list[PartitionCommit]:
    """Commit micro-batch ``batch_id`` of a streaming query: each partition's rows at most once."""
    rows = _collect(messages)
    query_ids = {message.query_id for message in rows}
    if not rows:
        return []
    if len(query_ids) != 1 or None in query_ids:
        raise SinkCommitError(
            f"the tasks of batch {batch_id} report streaming query ids {sorted(map(str, query_ids))}: expected one "
            f"(Spark's local property {QUERY_ID_PROPERTY})"
        )
    (query_id,) = query_ids
    assert query_id is not None
    return _run(options, rows, register_name(query_id), batch_id)


def commit_write(options: SinkOptions, messages: Sequence[object]) -> list[PartitionCommit]:
    """Commit a batch write (``df.write``): one plain append per partition."""
    return _run(options, _collect(messages), None, None)


def _collect(messages: Sequence[object]) -> list[TaskRows]:
    out = []
    for message in messages:
        if not isinstance(message, TaskRows):
            raise SinkCommitError(f"a task returned {type(message).__name__}, not the sink's TaskRows (did it fail?)")
        out.append(message)
    return out


def _run(
    options: SinkOptions, messages: list[TaskRows], name: str | None, batch_id: int | None
) -> list[PartitionCommit]:
    loop = _new_loop()
    try:
        return loop.run_until_complete(_commit(options, messages, name, batch_id))
    finally:
        loop.close()


async def _commit(
    options: SinkOptions, messages: list[TaskRows], name: str | None, batch_id: int | None
) -> list[PartitionCommit]:
    tables: dict[Target, list[pa.Table]] = {}
    for message in messages:  # in task order: a partition's rows keep Spark's order
        for part in message.parts:
            tables.setdefault((part.stream, part.partition), []).append(part.rows)
    if not tables:
        return []
    cluster = Cluster(list(options.brokers), ssl=options.ssl(), credentials=options.credentials)
    committer = _Committer(cluster, Appender(cluster=cluster), name, batch_id)
    try:
        await committer.check_targets(sorted(tables))
        results = await asyncio.gather(
            *(committer.commit(stream, partition, records_of(parts)) for (stream, partition), parts in tables.items()),
            return_exceptions=True,
        )
    finally:
        await cluster.close()
    failures = [result for result in results if isinstance(result, BaseException)]
    if failures:
        raise failures[0]
    commits = [result for result in results if isinstance(result, PartitionCommit)]
    skipped = [f"{c.stream}/{c.partition}" for c in commits if c.outcome is Outcome.SKIPPED]
    if skipped:
        log.info("batch %s was in %s already (a replay): not written again", batch_id, ", ".join(skipped))
    return commits


def records_of(tables: Sequence[pa.Table]) -> list[RecordLike]:
    """A partition's rows as the appender's records: plain values when no row has a key, headers or a null
    value (the appender's fast path), else :class:`NewRecord`\\ s."""
    out: list[RecordLike] = []
    for table in tables:
        n = table.num_rows
        values = table.column("value")
        keys, headers = table.column("key"), table.column("headers")
        if keys.null_count == n and headers.null_count == n and values.null_count == 0:
            out += values.to_pylist()
            continue
        for value, key, pairs in zip(values.to_pylist(), keys.to_pylist(), headers.to_pylist(), strict=True):
            header_list = [(pair["key"], pair["value"] or b"") for pair in pairs] if pairs else ()
            out.append(NewRecord(value, key, header_list))
    return out


class _Committer:
    """Commits one batch's partitions over one cluster connection (see the module docstring)."""

    def __init__(self, cluster: Cluster, appender: Appender, name: str | None, batch_id: int | None) -> None:
        self.cluster = cluster
        self.appender = appender
        self.name = name  # None: a batch write, unguarded
        self.batch_id = batch_id

    async def check_targets(self, targets: Sequence[Target]) -> None:
        """Refuse the batch before writing any of it when a target stream or partition does not exist."""
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

    async def commit(self, stream: str, partition: int, records: list[RecordLike]) -> PartitionCommit:
        if self.name is None:
            outcome = await self._append(stream, partition, records, None, EMPTY)
            return PartitionCommit(stream, partition, len(records), Outcome.APPENDED, outcome)
        return await self.guarded(stream, partition, records, self.name)

    async def guarded(self, stream: str, partition: int, records: list[RecordLike], name: str) -> PartitionCommit:
        """Append ``records`` unless the partition holds this batch already; see steps 1–4 of the module."""
        assert self.batch_id is not None
        batch_id = self.batch_id
        skipped = PartitionCommit(stream, partition, len(records), Outcome.SKIPPED)
        mark = LabelSet.of((name, str(batch_id)))
        for delay in (*RETRY_DELAYS, None):
            try:
                state = await self.appender.registers(stream, partition)
                decision = decide(state.registers, name, batch_id)
                if decision.action is Action.SKIP:
                    await self.confirm_committed(stream, partition, state.log_end)
                    return skipped
                try:
                    base = await self._append(stream, partition, records, decision.check, mark)
                except RegisterMismatchError as exc:
                    details = refusal_details(exc)
                    now = batch_of(details.registers, name) if details is not None else None
                    if now is not None and now >= batch_id:
                        return skipped  # a refusal is sent once the state it saw is committed
                    raise SinkCommitError(
                        f"{stream}/{partition}: register {name} went from {decision.seen} to {now} while batch "
                        f"{batch_id} was being committed: another writer (a second driver of this query?) is "
                        "writing it"
                    ) from exc
                return PartitionCommit(stream, partition, len(records), Outcome.APPENDED, base)
            except (ConnectionClosedError, TidelogError) as exc:
                if isinstance(exc, TidelogError) and not exc.retriable:
                    raise SinkCommitError(f"{stream}/{partition}: batch {batch_id}: {exc}") from exc
                if delay is None:
                    raise SinkCommitError(f"{stream}/{partition}: batch {batch_id}: gave up: {exc}") from exc
                log.warning("%s/%s: batch %s: %s; reading the registers again", stream, partition, batch_id, exc)
                self.cluster.forget(stream)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    async def _append(
        self,
        stream: str,
        partition: int,
        records: list[RecordLike],
        check: LabelSelector | None,
        mark: LabelSet,
    ) -> int:
        if not records:
            return -1
        outcome = await self.appender.append(stream, partition, records, check_registers=check, union_registers=mark)
        return outcome.base_offset

    async def confirm_committed(self, stream: str, partition: int, log_end: int) -> None:
        """Wait until the partition's high watermark reaches ``log_end``: what the registers said is committed."""
        deadline = time.monotonic() + CONFIRM_WITHIN
        while (high_watermark := (await self._offsets(stream, partition)).high_watermark) < log_end:
            if time.monotonic() > deadline:
                raise SinkCommitError(
                    f"{stream}/{partition}: its registers say batch {self.batch_id} is there, but the log is "
                    f"committed only to {high_watermark} of {log_end} after {CONFIRM_WITHIN:.0f} s"
                )
            await asyncio.sleep(0.05)

    async def _offsets(self, stream: str, partition: int) -> ListOffsetsResponse:
        response = await self.cluster.leader_request(stream, partition, ListOffsetsRequest(stream, partition))
        assert isinstance(response.header, ListOffsetsResponse)
        return response.header
