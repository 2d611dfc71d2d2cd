"""What a sink task does, without Spark: columns made binary, each row routed to its partition, rows grouped.

Routing must match tidelog's producer (the key's CRC-32 modulo the partition count, round robin without a key)
and be deterministic, so a replayed micro-batch puts every row where it went the first time.
"""

from __future__ import annotations

import zlib

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from tidelog.client import TidelogClient
from tidelog.spark.sink_options import (
    SinkColumns,
    SinkOptionError,
    SinkOptions,
    SinkSchemaError,
    check_columns,
    parse_sink_options,
)
from tidelog.spark.writing import SinkRowError, TaskRows, write_task


def groups(message: TaskRows) -> dict[tuple[str, int], list[tuple[bytes | None, bytes | None, object]]]:
    return {
        (part.stream, part.partition): list(
            zip(
                part.rows.column("value").to_pylist(),
                part.rows.column("key").to_pylist(),
                part.rows.column("headers").to_pylist(),
                strict=True,
            )
        )
        for part in message.parts
    }


def run(options: SinkOptions, columns: SinkColumns, *batches: pa.RecordBatch, task_index: int = 0) -> TaskRows:
    return write_task(options, columns, iter(batches), task_index=task_index, query_id="q")


@pytest.fixture
def three(client: TidelogClient, stream_name: str) -> str:
    client.admin.create_stream(stream_name, partitions=3)
    return stream_name


def test_keyed_rows_go_where_the_producer_puts_them_and_keep_their_order(brokers: str, three: str) -> None:
    options = SinkOptions((brokers,), three)
    batch = pa.record_batch({"value": [f"v{i}" for i in range(12)], "key": [f"k{i % 4}" for i in range(12)]})
    found = groups(run(options, SinkColumns("value", "string", key="key"), batch))
    expected: dict[tuple[str, int], list[tuple[bytes | None, bytes | None, object]]] = {}
    for i in range(12):
        key = b"k%d" % (i % 4)
        expected.setdefault((three, zlib.crc32(key) % 3), []).append((b"v%d" % i, key, None))
    assert found == expected


def test_keyless_rows_go_round_robin_from_the_tasks_own_index(brokers: str, three: str) -> None:
    options = SinkOptions((brokers,), three)
    columns = SinkColumns("value", "binary")
    first = pa.record_batch({"value": pa.array([b"a", b"b", b"c", b"d"])})
    second = pa.record_batch({"value": pa.array([b"e"])})
    found = groups(run(options, columns, first, second, task_index=5))  # starts at 5 % 3 = 2
    assert found == {
        (three, 2): [(b"a", None, None), (b"d", None, None)],
        (three, 0): [(b"b", None, None), (b"e", None, None)],  # the count runs on across batches
        (three, 1): [(b"c", None, None)],
    }
    assert groups(run(options, columns, first, second, task_index=5)) == found  # a replay routes alike


def test_partition_and_stream_columns_route_each_row(brokers: str, client: TidelogClient, three: str) -> None:
    other = three + "-other"
    client.admin.create_stream(other, partitions=2)
    options = SinkOptions((brokers,), None)
    columns = SinkColumns("value", "binary", key="key", partition="partition", stream="stream")
    batch = pa.record_batch(
        {
            "value": pa.array([b"1", b"2", b"3", b"4"]),
            "key": pa.array([b"k", b"k", None, b"k"]),
            "partition": pa.array([2, None, 0, None], pa.int64()),
            "stream": [three, three, other, other],
        }
    )
    assert zlib.crc32(b"k") % 3 == 1 and zlib.crc32(b"k") % 2 == 1
    assert groups(run(options, columns, batch)) == {
        (three, 2): [(b"1", b"k", None)],  # the column wins over the key
        (three, 1): [(b"2", b"k", None)],  # a null partition: by the key
        (other, 0): [(b"3", None, None)],
        (other, 1): [(b"4", b"k", None)],
    }


def test_string_columns_and_map_headers_become_binary(brokers: str, three: str) -> None:
    options = SinkOptions((brokers,), three)
    columns = SinkColumns("value", "string", key="key", headers="headers", headers_shape="map", partition="p")
    batch = pa.record_batch(
        {
            "value": pa.array(["é", None]),
            "key": pa.array(["k", "k"]),
            "headers": pa.array([[("trace", "t1")], None], pa.map_(pa.string(), pa.string())),
            "p": pa.array([0, 0], pa.int8()),
        }
    )
    assert groups(run(options, columns, batch)) == {
        (three, 0): [("é".encode(), b"k", [{"key": "trace", "value": b"t1"}]), (None, b"k", None)]
    }


@pytest.mark.parametrize(
    ("batch", "columns", "problem"),
    [
        (
            pa.record_batch({"value": [b"x"], "stream": pa.array([None], pa.string())}),
            SinkColumns("value", "binary", stream="stream"),
            "null 'stream'",
        ),
        (
            pa.record_batch({"value": [b"x"], "partition": [-1]}),
            SinkColumns("value", "binary", partition="partition"),
            "negative",
        ),
        (
            pa.record_batch(
                {
                    "value": [b"x"],
                    "h": pa.array(
                        [[(None, b"v")]], pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
                    ),
                }
            ),
            SinkColumns("value", "binary", headers="h", headers_shape="array"),
            "no name",
        ),
    ],
)
def test_rows_the_sink_cannot_write_fail_the_task(
    brokers: str, batch: pa.RecordBatch, columns: SinkColumns, problem: str
) -> None:
    options = SinkOptions((brokers,), None if columns.stream else "never-looked-up")
    with pytest.raises(SinkRowError, match=problem):
        run(options, columns, batch)


# -- options and columns -------------------------------------------------------------------------------------------

HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))


def schema(**fields: object) -> StructType:
    return StructType([StructField(name, kind) for name, kind in fields.items()])  # type: ignore[arg-type]


def test_columns_are_found_in_any_case_and_the_stream_option_overrides_the_column() -> None:
    options = parse_sink_options({"BROKERS": "h:1", "Stream": " out ", "checkpointlocation": "/x", "queryname": "q"})
    assert options == SinkOptions(("h:1",), "out")
    found = check_columns(
        schema(
            VALUE=StringType(),
            Key=BinaryType(),
            headers=HEADERS,
            partition=LongType(),
            stream=StringType(),
            x=DoubleType(),
        ),
        options,
    )
    assert found == SinkColumns(
        "VALUE", "string", key="Key", headers="headers", headers_shape="array", partition="partition"
    )
    by_row = check_columns(schema(value=BinaryType(), stream=StringType()), parse_sink_options({}))
    assert by_row.stream == "stream"


@pytest.mark.parametrize(
    ("fields", "column"),
    [
        ({"key": BinaryType()}, "value"),
        ({"value": IntegerType()}, "value"),
        ({"value": BinaryType(), "key": LongType()}, "key"),
        ({"value": BinaryType(), "partition": StringType()}, "partition"),
        ({"value": BinaryType(), "headers": MapType(StringType(), IntegerType())}, "headers"),
        ({"value": BinaryType(), "headers": ArrayType(StringType())}, "headers"),
        ({"value": BinaryType(), "Value": BinaryType()}, "value"),
    ],
)
def test_bad_columns_are_named(fields: dict[str, object], column: str) -> None:
    with pytest.raises(SinkSchemaError) as caught:
        check_columns(schema(**fields), SinkOptions(("h:1",), "s"))
    assert caught.value.column == column


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"stream": "s", "topic": "t"}, "topic"),
        ({"stream": "s", "brokers": "nohost"}, "brokers"),
        ({"stream": "  "}, "stream"),
        ({"stream": "s", "registerSlots": "0"}, "registerSlots"),
        ({"stream": "s", "registerslots": "33"}, "registerSlots"),
        ({"stream": "s", "registerSlots": "many"}, "registerSlots"),
    ],
)
def test_bad_options_are_named(options: dict[str, str], option: str) -> None:
    with pytest.raises(SinkOptionError) as caught:
        parse_sink_options(options)
    assert caught.value.option == option


def test_register_slots_default_to_eight_and_may_be_set() -> None:
    assert parse_sink_options({"stream": "s"}).slots == 8
    assert parse_sink_options({"stream": "s", "registerSlots": " 32 "}).slots == 32


def test_rows_need_a_stream_from_somewhere() -> None:
    with pytest.raises(SinkOptionError) as caught:
        check_columns(schema(value=BinaryType()), parse_sink_options({}))
    assert caught.value.option == "stream"
