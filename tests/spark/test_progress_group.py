"""``groupId``/``groupIdPrefix``: a streaming query's progress stored as a consumer group's committed offsets, so
``tidelog group describe`` shows its lag like any consumer's; checked on the driver, refused in batch reads."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

pytest.importorskip("pyspark")

from click.testing import CliRunner

from tests.spark.test_source import produce, reader, run_available_now, table_name
from tidelog.cli.main import cli
from tidelog.client import TidelogClient
from tidelog.spark.options import SourceOptionError, parse_options
from tidelog.spark.source import TidelogStreamReader, group_of

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_group_options_are_checked() -> None:
    assert parse_options({"streams": "s"}).group_id is None
    fixed = parse_options({"streams": "s", "GROUPID": " etl "})
    assert fixed.group_id == "etl" and group_of(fixed) == "etl"
    prefixed = parse_options({"streams": "s", "groupIdPrefix": "etl"})
    one, two = group_of(prefixed), group_of(prefixed)
    assert one is not None and two is not None and one != two  # a new group for each run
    assert one.startswith("etl-") and len(one) == len("etl-") + 12
    with pytest.raises(SourceOptionError, match=r"'groupId': give groupId or groupIdPrefix, not both"):
        parse_options({"streams": "s", "groupId": "a", "groupIdPrefix": "b"})
    with pytest.raises(SourceOptionError, match=r"'groupId': 'a/b' may not contain '/'"):
        parse_options({"streams": "s", "groupId": "a/b"})
    with pytest.raises(SourceOptionError, match=r"'groupIdPrefix': must be 1 to 242 characters, got 243"):
        parse_options({"streams": "s", "groupIdPrefix": "p" * 243})
    with pytest.raises(SourceOptionError, match=r"'groupId': applies to streaming reads only"):
        parse_options({"streams": "s", "groupId": "etl"}).check_kind("batch")


def describe(brokers: str, group: str) -> dict[int, tuple[int, int]]:
    """``tidelog group describe GROUP -o json``: (committed, lag) by partition."""
    result = CliRunner().invoke(cli, ["group", "describe", group, "--output", "json", "--brokers", brokers])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    return {row["partition"]: (row["committed"], row["lag"]) for row in shown["partitions"]}


@pytest.mark.slow
def test_a_querys_progress_shows_as_a_consumer_groups_lag(
    spark: SparkSession, brokers: str, client: TidelogClient, stream_name: str
) -> None:
    stream = stream_name
    client.admin.create_stream(stream, stream, partitions=2)
    produce(client, stream, 0, 30)
    produce(client, stream, 1, 20)
    source = reader(spark, brokers, streams=stream, startingOffsets="earliest", groupId=stream + "-etl")
    run_available_now(spark, source, table_name(stream))
    assert describe(brokers, stream + "-etl") == {0: (30, 0), 1: (20, 0)}
    produce(client, stream, 0, 5, first=30)
    assert describe(brokers, stream + "-etl") == {0: (30, 5), 1: (20, 0)}  # records the query has yet to read


def test_the_stream_readers_commit_stores_the_groups_offsets(
    brokers: str, client: TidelogClient, stream_name: str
) -> None:
    """Without Spark: what ``commit`` stores, and a deleted stream's offsets skipped rather than failing."""
    client.admin.create_stream(stream_name, stream_name, partitions=2)
    produce(client, stream_name, 1, 3)
    source = TidelogStreamReader(
        parse_options({"brokers": brokers, "streamPattern": stream_name + ".*", "groupId": stream_name})
    )
    try:
        source.commit({stream_name: {"0": 0, "1": 3}, stream_name + "-gone": {"0": 7}})
    finally:
        source.stop()
    assert describe(brokers, stream_name) == {0: (0, 0), 1: (3, 0)}
