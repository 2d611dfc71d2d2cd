"""A sink task's commit against a real broker, without Spark: each (micro-batch, task) slice lands once.

The commit is driven here exactly as a Spark task drives it (``commit_task`` with the task's grouped rows and its
fence), so task retries, speculative copies, replays after a driver crash, and tasks contending for one register
can be staged precisely; the tests in ``test_sink.py`` show the same through a real Spark query.
"""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from tidelog.client import Appender, LoopThread, TidelogClient
from tidelog.protocol.labels import LabelSet
from tidelog.spark.sink_commit import (
    Outcome,
    PartitionCommit,
    SinkCommitError,
    TaskCommit,
    check_batch,
    commit_task,
)
from tidelog.spark.sink_fence import Fence, slot_label
from tidelog.spark.sink_options import SinkOptions
from tidelog.spark.writing import ROWS_SCHEMA, PartitionRows, TaskRows

QUERY = "4f1c2a7e-0000-4000-8000-00000000cafe"


def rows(values: list[bytes], keys: list[bytes | None] | None = None) -> pa.Table:
    headers = pa.nulls(len(values), ROWS_SCHEMA.field("headers").type)
    key_column = pa.array(keys if keys is not None else [None] * len(values), pa.binary())
    return pa.Table.from_arrays([pa.array(values, pa.binary()), key_column, headers], schema=ROWS_SCHEMA)


def task_rows(stream: str, by_partition: dict[int, list[bytes]], query_id: str | None = QUERY) -> TaskRows:
    return TaskRows(query_id, tuple(PartitionRows(stream, p, rows(values)) for p, values in by_partition.items()))


def run_task(
    options: SinkOptions,
    stream: str,
    batch: int,
    task: int,
    by_partition: dict[int, list[bytes]],
    *,
    query_id: str = QUERY,
    slots: int | None = None,
) -> TaskCommit:
    """What task ``task`` of micro-batch ``batch`` does once its rows are grouped."""
    fence = Fence(query_id, batch, task, slots or options.slots)
    return commit_task(options, task_rows(stream, by_partition, query_id), fence, task)


def outcomes(message: TaskCommit) -> dict[int, str]:
    return {c.partition: c.outcome for c in message.commits}


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
    return SinkOptions(brokers=(brokers,), stream=None, slots=4)


def test_rows_land_with_their_keys_headers_and_tombstones(
    client: TidelogClient, options: SinkOptions, stream_name: str
) -> None:
    """The task's rows, encoded in bulk (:mod:`tidelog.spark.record_encoding`), as the broker stores them."""
    client.admin.create_stream(stream_name)
    headers = pa.array(
        [[{"key": "h", "value": b"1"}, {"key": "h", "value": None}], None, []], ROWS_SCHEMA.field("headers").type
    )
    table = pa.Table.from_arrays(
        [pa.array([b"v", None, b""], pa.binary()), pa.array([b"k", None, b""], pa.binary()), headers],
        schema=ROWS_SCHEMA,
    )
    message = commit_task(options, TaskRows(None, (PartitionRows(stream_name, 0, table),)), None, 0)
    assert message.appended == 3
    with client.consumer(stream_name, stop_at_end=True) as consumer:
        got = [(r.value, r.key, list(r.headers)) for r in consumer]
    assert got == [(b"v", b"k", [("h", b"1"), ("h", b"")]), (None, None, []), (b"", b"", [])]


def test_a_repeated_task_writes_nothing_and_a_replay_completes_the_rest(
    client: TidelogClient, options: SinkOptions, stream_name: str
) -> None:
    """Task 0 of micro-batch 5 appended, then the driver died before task 1 ran: the replay skips task 0's
    slices and writes task 1's; a retry of task 1 (it failed after appending) writes nothing either."""
    client.admin.create_stream(stream_name, partitions=2)
    first = run_task(options, stream_name, 5, 0, {0: [b"t0-p0"], 1: [b"t0-p1"]})
    assert outcomes(first) == {0: Outcome.APPENDED, 1: Outcome.APPENDED}
    replay = [run_task(options, stream_name, 5, t, {0: [b"t%d-p0" % t], 1: [b"t%d-p1" % t]}) for t in (0, 1)]
    assert [outcomes(m) for m in replay] == [{0: "skipped", 1: "skipped"}, {0: "appended", 1: "appended"}]
    retry = run_task(options, stream_name, 5, 1, {0: [b"t1-p0"], 1: [b"t1-p1"]})
    assert outcomes(retry) == {0: Outcome.SKIPPED, 1: Outcome.SKIPPED}
    assert check_batch([*replay], 5) == replay  # the driver's commit: every task reported, for this batch
    assert values_in(client, stream_name) == {0: [b"t0-p0", b"t1-p0"], 1: [b"t0-p1", b"t1-p1"]}


def test_a_zombie_of_a_committed_micro_batch_writes_nothing(
    client: TidelogClient, options: SinkOptions, stream_name: str
) -> None:
    client.admin.create_stream(stream_name)
    run_task(options, stream_name, 3, 0, {0: [b"b3"]})
    run_task(options, stream_name, 4, 4, {0: [b"b4"]})  # task 4 shares task 0's slot (4 slots): a new micro-batch
    assert outcomes(run_task(options, stream_name, 3, 0, {0: [b"late"]})) == {0: Outcome.SKIPPED}
    assert values_in(client, stream_name) == {0: [b"b3", b"b4"]}


def test_tasks_of_one_slot_take_turns_and_each_lands_once(
    client: TidelogClient, broker_thread: LoopThread, brokers: str, options: SinkOptions, stream_name: str
) -> None:
    """Eight tasks, two per slot, and a speculative copy of each, all at once on one partition."""
    client.admin.create_stream(stream_name)
    results: list[TaskCommit] = []
    errors: list[BaseException] = []

    def attempt(task: int) -> None:
        try:
            results.append(run_task(options, stream_name, 0, task, {0: [b"%d-%d" % (task, i) for i in range(50)]}))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=attempt, args=(task,)) for task in range(8) for _ in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == [] and len(results) == 16
    assert sorted(m.appended for m in results) == [0] * 8 + [50] * 8  # one attempt of each task wrote
    found = values_in(client, stream_name)[0]
    assert sorted(found) == sorted(b"%d-%d" % (task, i) for task in range(8) for i in range(50))
    labels = registers_of(broker_thread, brokers, stream_name, 0)
    assert labels == LabelSet((slot_label(QUERY, s), "0.4.3") for s in range(4))  # both tasks of every slot


def test_a_long_query_keeps_one_register_per_slot(
    client: TidelogClient, broker_thread: LoopThread, brokers: str, options: SinkOptions, stream_name: str
) -> None:
    client.admin.create_stream(stream_name)
    for batch in range(40):
        for task in range(6):
            run_task(options, stream_name, batch, task, {0: [b"%d-%d" % (batch, task)]})
    labels = registers_of(broker_thread, brokers, stream_name, 0)
    assert labels == LabelSet.of(
        (slot_label(QUERY, 0), "39.4.3"),  # tasks 0 and 4
        (slot_label(QUERY, 1), "39.4.3"),  # tasks 1 and 5
        (slot_label(QUERY, 2), "39.4.1"),
        (slot_label(QUERY, 3), "39.4.1"),
    )
    assert len(values_in(client, stream_name)[0]) == 240


def test_other_labels_and_other_queries_are_left_alone(
    client: TidelogClient, broker_thread: LoopThread, brokers: str, options: SinkOptions, stream_name: str
) -> None:
    client.admin.create_stream(stream_name)
    other = "0a0a0a0a-1111-4222-8333-444444444444"
    run_task(options, stream_name, 0, 0, {0: [b"q0"]})
    run_task(options, stream_name, 0, 0, {0: [b"other0"]}, query_id=other)
    run_task(options, stream_name, 1, 0, {0: [b"q1"]})
    assert registers_of(broker_thread, brokers, stream_name, 0) == LabelSet.of(
        (slot_label(QUERY, 0), "1.4.1"), (slot_label(other, 0), "0.4.1")
    )
    assert values_in(client, stream_name) == {0: [b"q0", b"other0", b"q1"]}


def test_a_query_restarted_with_other_slots_or_a_foreign_label_fails_before_writing(
    client: TidelogClient, options: SinkOptions, stream_name: str, brokers: str, broker_thread: LoopThread
) -> None:
    client.admin.create_stream(stream_name)
    run_task(options, stream_name, 0, 0, {0: [b"a"]})
    with pytest.raises(SinkCommitError, match="registerSlots=4, and this task runs with 8"):
        run_task(options, stream_name, 1, 1, {0: [b"b"]}, slots=8)

    async def foreign() -> None:  # another program's label under the sink's name
        async with Appender(brokers) as appender:
            await appender.append(stream_name, 0, [b"x"], union_registers=LabelSet.of((slot_label(QUERY, 1), "mine")))

    broker_thread.run(foreign(), timeout=30)
    with pytest.raises(SinkCommitError, match="not written by this sink"):
        run_task(options, stream_name, 1, 1, {0: [b"b"]})
    assert values_in(client, stream_name) == {0: [b"a", b"x"]}


def test_the_earlier_driver_side_label_still_fences_its_query(
    client: TidelogClient, options: SinkOptions, stream_name: str, brokers: str, broker_thread: LoopThread
) -> None:
    """A checkpoint written by the driver-side sink recorded its last micro-batch in ``spark.<query>``."""
    client.admin.create_stream(stream_name)

    async def legacy() -> None:
        async with Appender(brokers) as appender:
            await appender.append(stream_name, 0, [b"old-7"], union_registers=LabelSet.of(("spark." + QUERY, "7")))

    broker_thread.run(legacy(), timeout=30)
    assert outcomes(run_task(options, stream_name, 7, 0, {0: [b"replayed-7"]})) == {0: Outcome.SKIPPED}
    assert outcomes(run_task(options, stream_name, 8, 0, {0: [b"new-8"]})) == {0: Outcome.APPENDED}
    assert values_in(client, stream_name) == {0: [b"old-7", b"new-8"]}


def test_a_batch_write_appends_without_touching_the_registers(
    client: TidelogClient, broker_thread: LoopThread, brokers: str, options: SinkOptions, stream_name: str
) -> None:
    client.admin.create_stream(stream_name)
    messages = [
        commit_task(options, task_rows(stream_name, {0: [v]}, None), None, t) for t, v in enumerate([b"a", b"b"])
    ]
    assert [m.appended for m in check_batch(messages, None)] == [1, 1]
    assert values_in(client, stream_name) == {0: [b"a", b"b"]}
    assert registers_of(broker_thread, brokers, stream_name, 0) == LabelSet()


def test_targets_are_checked_before_anything_is_written(
    client: TidelogClient, options: SinkOptions, stream_name: str
) -> None:
    client.admin.create_stream(stream_name)
    with pytest.raises(SinkCommitError, match=f"partition 3 of stream '{stream_name}', which has 1"):
        run_task(options, stream_name, 0, 0, {0: [b"fine"], 3: [b"nowhere"]})
    with pytest.raises(SinkCommitError, match="does not exist"):
        run_task(options, stream_name + "-missing", 0, 0, {0: [b"x"]})
    assert values_in(client, stream_name) == {}


def test_the_driver_refuses_a_message_of_another_micro_batch(options: SinkOptions) -> None:
    stale = TaskCommit(QUERY, 4, 0, ())
    assert check_batch([stale], 5) == [stale]  # a task that wrote nothing
    written = TaskCommit(QUERY, 4, 0, (PartitionCommit("s", 0, 1, Outcome.APPENDED, 0),))
    with pytest.raises(SinkCommitError, match="micro-batch 4 while Spark commits 5"):
        check_batch([written], 5)
    with pytest.raises(SinkCommitError, match="not the sink's TaskCommit"):
        check_batch([None], 5)
