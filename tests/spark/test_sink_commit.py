"""The sink's commit protocol against a real broker, without Spark: each micro-batch lands once per partition.

The commit is driven here exactly as PySpark drives it on the driver (``commit_stream_batch`` with the tasks'
messages and a batch id), so replays, partial commits and a racing second driver can be staged precisely; the
tests in ``test_sink.py`` show the same through a real Spark query.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from tidelog.client import Appender, AppendOutcome, LoopThread, TidelogClient
from tidelog.protocol.labels import LabelSelector, LabelSet
from tidelog.spark.sink_commit import (
    Action,
    Outcome,
    PartitionCommit,
    SinkCommitError,
    _Committer,
    batch_of,
    commit_stream_batch,
    commit_write,
    decide,
    records_of,
    register_name,
)
from tidelog.spark.sink_options import SinkOptions
from tidelog.spark.writing import ROWS_SCHEMA, PartitionRows, TaskRows

QUERY = "4f1c2a7e-0000-4000-8000-00000000cafe"
NAME = register_name(QUERY)


def rows(values: list[bytes], keys: list[bytes | None] | None = None) -> pa.Table:
    headers = pa.nulls(len(values), ROWS_SCHEMA.field("headers").type)
    key_column = pa.array(keys if keys is not None else [None] * len(values), pa.binary())
    return pa.Table.from_arrays([pa.array(values, pa.binary()), key_column, headers], schema=ROWS_SCHEMA)


def task(stream: str, by_partition: dict[int, list[bytes]], query_id: str | None = QUERY) -> TaskRows:
    return TaskRows(query_id, tuple(PartitionRows(stream, p, rows(values)) for p, values in by_partition.items()))


def values_in(client: TidelogClient, stream: str) -> dict[int, list[bytes | None]]:
    out: dict[int, list[bytes | None]] = {}
    with client.consumer(stream, stop_at_end=True) as consumer:
        for record in consumer:
            out.setdefault(record.partition, []).append(record.value)
    return out


def registers_of(broker_thread: LoopThread, brokers: str, stream: str, partition: int) -> LabelSet:
    async def read() -> LabelSet:
        async with Appender(brokers) as appender:
            return (await appender.registers(stream, partition)).registers

    return broker_thread.run(read(), timeout=30)


@pytest.fixture
def options(brokers: str) -> SinkOptions:
    return SinkOptions(brokers=(brokers,), stream=None)


# -- deciding ------------------------------------------------------------------------------------------------------


def test_the_decision_is_a_compare_and_set_on_the_querys_label() -> None:
    other = ("author", "someone")
    fresh = decide(LabelSet.of(other), NAME, 0)
    assert fresh.action is Action.APPEND and fresh.seen is None
    assert fresh.check == LabelSelector(exclude=LabelSet.of((NAME, "")))
    assert fresh.check is not None and not fresh.check.selects(LabelSet.of(other, (NAME, "0")))
    behind = decide(LabelSet.of(other, (NAME, "6")), NAME, 7)
    assert (behind.action, behind.seen) == (Action.APPEND, 6)
    assert behind.check == LabelSelector(include=LabelSet.of((NAME, "6")))
    assert decide(LabelSet.of((NAME, "7")), NAME, 7).action is Action.SKIP  # a replay
    assert decide(LabelSet.of((NAME, "12")), NAME, 7).action is Action.SKIP
    assert decide(LabelSet.of((register_name("another-query"), "99")), NAME, 7).action is Action.APPEND


def test_a_label_this_sink_cannot_have_written_fails_loudly() -> None:
    with pytest.raises(SinkCommitError, match="not one batch id"):
        batch_of(LabelSet.of((NAME, "seven")), NAME)
    with pytest.raises(SinkCommitError, match="not one batch id"):
        decide(LabelSet.of((NAME, "1"), (NAME, "2")), NAME, 3)


def test_records_keep_keys_headers_and_tombstones() -> None:
    plain = rows([b"a", b"b"])
    assert records_of([plain, plain]) == [b"a", b"b", b"a", b"b"]  # the appender's fast path: plain values
    headers = pa.array([[{"key": "h", "value": b"1"}, {"key": "h", "value": None}], None], plain.schema[2].type)
    table = pa.Table.from_arrays(
        [pa.array([b"v", None], pa.binary()), pa.array([b"k", None], pa.binary()), headers], schema=ROWS_SCHEMA
    )
    first, second = records_of([table])
    assert not isinstance(first, bytes) and not isinstance(second, bytes)
    assert (first.value, first.key, list(first.headers)) == (b"v", b"k", [("h", b"1"), ("h", b"")])
    assert (second.value, second.key, list(second.headers)) == (None, None, [])


# -- committing against a broker -------------------------------------------------------------------------------------


def test_each_batch_lands_once_per_partition_and_a_replay_writes_nothing(
    client: TidelogClient, broker_thread: LoopThread, brokers: str, options: SinkOptions, stream_name: str
) -> None:
    client.admin.create_stream(stream_name, partitions=2)
    batch0 = [task(stream_name, {0: [b"a0", b"a1"]}), task(stream_name, {0: [b"b0"], 1: [b"b1"]})]
    first = commit_stream_batch(options, batch0, 0)
    assert {(c.partition, c.records, c.outcome) for c in first} == {(0, 3, Outcome.APPENDED), (1, 1, Outcome.APPENDED)}
    replay = commit_stream_batch(options, batch0, 0)  # Spark replays batch 0 after a crash
    assert {(c.partition, c.outcome) for c in replay} == {(0, Outcome.SKIPPED), (1, Outcome.SKIPPED)}
    commit_stream_batch(options, [task(stream_name, {1: [b"c1"]})], 1)  # partition 0 has nothing in batch 1
    assert values_in(client, stream_name) == {0: [b"a0", b"a1", b"b0"], 1: [b"b1", b"c1"]}
    assert registers_of(broker_thread, brokers, stream_name, 0) == LabelSet.of((NAME, "0"))
    assert registers_of(broker_thread, brokers, stream_name, 1) == LabelSet.of((NAME, "1"))


def test_a_replay_completes_a_commit_that_stopped_between_partitions(
    client: TidelogClient, broker_thread: LoopThread, brokers: str, options: SinkOptions, stream_name: str
) -> None:
    """The driver died after partition 0's append and before partition 1's: the replay writes partition 1 only."""
    client.admin.create_stream(stream_name, partitions=2)
    commit_stream_batch(options, [task(stream_name, {0: [b"x"], 1: [b"y"]})], 4)
    batch5 = [task(stream_name, {0: [b"p0-a", b"p0-b"], 1: [b"p1-a"]})]
    commit_stream_batch(options, [task(stream_name, {0: [b"p0-a", b"p0-b"]})], 5)  # the first run, cut short
    replay = commit_stream_batch(options, batch5, 5)
    assert {(c.partition, c.outcome) for c in replay} == {(0, Outcome.SKIPPED), (1, Outcome.APPENDED)}
    assert values_in(client, stream_name) == {0: [b"x", b"p0-a", b"p0-b"], 1: [b"y", b"p1-a"]}


def test_other_labels_and_other_queries_are_left_alone(
    client: TidelogClient, broker_thread: LoopThread, brokers: str, options: SinkOptions, stream_name: str
) -> None:
    client.admin.create_stream(stream_name)
    other = register_name("0a0a0a0a-1111-4222-8333-444444444444")
    for query_id, batch_id in ((QUERY, 0), (other[len("spark.") :], 0), (QUERY, 1)):
        commit_stream_batch(options, [task(stream_name, {0: [b"%d" % batch_id]}, query_id)], batch_id)
    assert registers_of(broker_thread, brokers, stream_name, 0) == LabelSet.of((NAME, "1"), (other, "0"))
    assert values_in(client, stream_name) == {0: [b"0", b"0", b"1"]}


class _StaleFirstRead(Appender):
    """An appender whose first register read returns ``stale``: as if another driver appended right after it."""

    def __init__(self, brokers: str, stale: AppendOutcome) -> None:
        super().__init__(brokers)
        self._stale: AppendOutcome | None = stale

    async def registers(self, stream: str, partition: int) -> AppendOutcome:
        stale, self._stale = self._stale, None
        return stale if stale is not None else await super().registers(stream, partition)


def guarded(brokers: str, stream: str, batch_id: int, stale: AppendOutcome) -> Callable[[], PartitionCommit]:
    async def run() -> PartitionCommit:
        appender = _StaleFirstRead(brokers, stale)
        try:
            return await _Committer(appender.cluster, appender, NAME, batch_id).guarded(stream, 0, [b"late"], NAME)
        finally:
            await appender.close()

    return lambda: asyncio.run(run())


def test_a_second_driver_racing_on_the_same_batch_writes_nothing(
    client: TidelogClient, options: SinkOptions, stream_name: str, brokers: str
) -> None:
    """Both drivers read the registers before either appended; the one that lands second is refused by the
    register check, sees that the batch is there, and skips it."""
    client.admin.create_stream(stream_name)
    commit_stream_batch(options, [task(stream_name, {0: [b"b2"]})], 2)
    before = AppendOutcome(-1, -1, 1, LabelSet.of((NAME, "2")))  # what both read: batch 2 is the last
    commit_stream_batch(options, [task(stream_name, {0: [b"first"]})], 3)  # the other driver lands batch 3
    assert guarded(brokers, stream_name, 3, before)().outcome is Outcome.SKIPPED
    assert values_in(client, stream_name) == {0: [b"b2", b"first"]}


def test_a_register_moved_elsewhere_fails_the_commit_loudly(
    client: TidelogClient, options: SinkOptions, stream_name: str, brokers: str
) -> None:
    client.admin.create_stream(stream_name)
    commit_stream_batch(options, [task(stream_name, {0: [b"b2"]})], 2)
    stale = AppendOutcome(-1, -1, 0, LabelSet())  # read before batch 2 landed, while committing batch 3
    with pytest.raises(SinkCommitError, match="another writer"):
        guarded(brokers, stream_name, 3, stale)()
    assert values_in(client, stream_name) == {0: [b"b2"]}


def test_concurrent_drivers_commit_a_batch_exactly_once(
    client: TidelogClient, options: SinkOptions, stream_name: str
) -> None:
    client.admin.create_stream(stream_name, partitions=2)
    batch = [task(stream_name, {0: [b"%d" % i for i in range(2000)], 1: [b"one"]})]
    results: list[list[PartitionCommit]] = []
    drivers = [threading.Thread(target=lambda: results.append(commit_stream_batch(options, batch, 0))) for _ in "ab"]
    for driver in drivers:
        driver.start()
    for driver in drivers:
        driver.join(60)
    assert len(results) == 2
    outcomes = sorted(c.outcome.value for result in results for c in result if c.partition == 0)
    assert outcomes == ["appended", "skipped"]
    found = values_in(client, stream_name)
    assert (len(found[0]), found[1]) == (2000, [b"one"])


def test_a_batch_write_appends_without_touching_the_registers(
    client: TidelogClient, broker_thread: LoopThread, brokers: str, options: SinkOptions, stream_name: str
) -> None:
    client.admin.create_stream(stream_name)
    commit_write(options, [task(stream_name, {0: [b"a"]}, None), task(stream_name, {0: [b"b"]}, None)])
    assert values_in(client, stream_name) == {0: [b"a", b"b"]}
    assert registers_of(broker_thread, brokers, stream_name, 0) == LabelSet()


def test_targets_are_checked_before_anything_is_written(
    client: TidelogClient, options: SinkOptions, stream_name: str
) -> None:
    client.admin.create_stream(stream_name)
    with pytest.raises(SinkCommitError, match=f"partition 3 of stream '{stream_name}', which has 1"):
        commit_stream_batch(options, [task(stream_name, {0: [b"fine"], 3: [b"nowhere"]})], 0)
    with pytest.raises(SinkCommitError, match="does not exist"):
        commit_stream_batch(options, [task(stream_name + "-missing", {0: [b"x"]})], 0)
    with pytest.raises(SinkCommitError, match="query ids"):
        commit_stream_batch(options, [task(stream_name, {0: [b"x"]}, None)], 0)
    assert values_in(client, stream_name) == {}
