"""Options, offsets, admission control and splitting, without Spark or a broker: the driver's arithmetic.

Admission control is checked against its contract on random lags (never more than the limit, exactly the limit
when there is that much to read, every partition within its lag, and none starved for ever); splitting against
its own (the ranges cover exactly what was asked, no piece too long, at least ``minPartitions`` pieces).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark")

import itertools

from tidelog.spark.options import DEFAULT_MAX_OFFSETS_PER_SPLIT, SourceOptionError, parse_options
from tidelog.spark.planning import OffsetRange, admit, from_json, split, to_json, waits


def test_options_are_parsed_case_insensitively_with_kafkas_defaults() -> None:
    parsed = parse_options(
        {"STREAMS": "a, b,a", "startingoffsets": '{"a": {"0": -2}, "b": {"1": 7}}', "maxOffsetsPerTrigger": "10"}
    )
    assert parsed.streams == ("a", "b")
    assert parsed.starting == {("a", 0): -2, ("b", 1): 7}
    assert parsed.max_offsets_per_trigger == 10
    assert parsed.brokers == ("127.0.0.1:9293",)
    assert parsed.ending == "latest" and parsed.fail_on_data_loss and not parsed.include_headers
    assert parsed.max_offsets_per_split == DEFAULT_MAX_OFFSETS_PER_SPLIT
    assert parsed.matches("a") and not parsed.matches("c")
    assert parse_options({"streamPattern": "ord.*"}).matches("orders")
    assert not parse_options({"streamPattern": "ord"}).matches("orders")  # the whole name must match


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"streams": "a", "topic": "a"}, "topic"),
        ({}, "streams"),
        ({"streams": "a", "streamPattern": "a"}, "streams"),
        ({"streams": " , "}, "streams"),
        ({"streamPattern": "("}, "streamPattern"),
        ({"streams": "a", "brokers": "localhost"}, "brokers"),
        ({"streams": "a", "startingOffsets": "{not json"}, "startingOffsets"),
        ({"streams": "a", "startingOffsets": "[1]"}, "startingOffsets"),
        ({"streams": "a", "startingOffsets": '{"a": 3}'}, "startingOffsets"),
        ({"streams": "a", "startingOffsets": '{"a": {"x": 3}}'}, "startingOffsets"),
        ({"streams": "a", "startingOffsets": '{"a": {"0": -3}}'}, "startingOffsets"),
        ({"streams": "a", "endingOffsets": '{"a": {"0": true}}'}, "endingOffsets"),
        ({"streams": "a", "startingTimestamp": "yesterday"}, "startingTimestamp"),
        ({"streams": "a", "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger"),
        ({"streams": "a", "minPartitions": "-1"}, "minPartitions"),
        ({"streams": "a", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({"streams": "a", "includeHeaders": "1"}, "includeHeaders"),
        ({"streams": "a", "minOffsetsPerTrigger": "0"}, "minOffsetsPerTrigger"),
        ({"streams": "a", "minOffsetsPerTrigger": "5", "maxTriggerDelay": "soon"}, "maxTriggerDelay"),
        ({"streams": "a", "minOffsetsPerTrigger": "5", "maxTriggerDelay": "5 days"}, "maxTriggerDelay"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, str], option: str) -> None:
    with pytest.raises(SourceOptionError) as caught:
        parse_options(options)
    assert caught.value.option == option
    assert repr(option) in str(caught.value)


@pytest.mark.parametrize(
    ("options", "kind", "option"),
    [
        ({"streams": "a", "endingOffsets": "latest"}, "stream", "endingOffsets"),
        ({"streams": "a", "maxOffsetsPerTrigger": "5"}, "batch", "maxOffsetsPerTrigger"),
        ({"streams": "a", "startingOffsets": "latest"}, "batch", "startingOffsets"),
        ({"streams": "a", "endingOffsets": "earliest"}, "batch", "endingOffsets"),
        ({"streams": "a", "endingOffsets": '{"a": {"0": -2}}'}, "batch", "endingOffsets"),
        ({"streams": "a", "minOffsetsPerTrigger": "5"}, "batch", "minOffsetsPerTrigger"),
        ({"streams": "a", "maxTriggerDelay": "5s"}, "stream", "maxTriggerDelay"),  # without minOffsetsPerTrigger
        ({"streams": "a", "minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "5"}, "stream", "minOffsetsPerTrigger"),
    ],
)
def test_options_that_do_not_apply_to_the_kind_of_query(options: dict[str, str], kind: str, option: str) -> None:
    parsed = parse_options(options)
    with pytest.raises(SourceOptionError) as caught:
        parsed.check_kind(kind)  # type: ignore[arg-type]
    assert caught.value.option == option


def test_min_offsets_per_trigger_waits_for_enough_offsets_or_the_delay() -> None:
    parsed = parse_options({"streams": "a", "minOffsetsPerTrigger": "10", "maxTriggerDelay": "30s"})
    assert (parsed.min_offsets_per_trigger, parsed.max_trigger_delay_ms) == (10, 30_000)
    assert parse_options({"streams": "a", "minOffsetsPerTrigger": "1"}).max_trigger_delay_ms == 15 * 60_000  # Kafka's
    start = {("a", 0): 5, ("a", 1): 0}
    assert waits(start, {("a", 0): 9, ("a", 1): 5}, 10, waited_ms=1_000, max_delay_ms=30_000)  # 9 of 10: wait
    assert not waits(start, {("a", 0): 10, ("a", 1): 5}, 10, waited_ms=1_000, max_delay_ms=30_000)  # 10: go
    assert not waits(start, {("a", 0): 6, ("a", 1): 0}, 10, waited_ms=30_000, max_delay_ms=30_000)  # waited enough
    assert not waits(start, {("a", 0): 6, ("a", 1): 0}, None, waited_ms=0, max_delay_ms=30_000)  # no minimum
    assert waits(start, {("a", 0): 5, ("a", 1): 0, ("a", 2): 3}, 4, waited_ms=0, max_delay_ms=30_000)  # a new one


def test_offsets_round_trip_through_sparks_json_sorted() -> None:
    offsets = {("b", 10): 5, ("b", 2): 7, ("a", 0): 0}
    document = to_json(offsets)
    assert list(document) == ["a", "b"] and list(document["b"]) == ["2", "10"]
    assert from_json(document) == offsets
    with pytest.raises(ValueError):
        from_json({"a": {"0": -1}})


lags = st.dictionaries(st.tuples(st.sampled_from("abc"), st.integers(0, 5)), st.integers(0, 10_000), max_size=8)


@settings(max_examples=300, deadline=None)
@given(lags, st.integers(1, 20_000), st.integers(0, 1000))
def test_admission_control_reads_at_most_the_limit_in_proportion_to_lag(
    lag: dict[tuple[str, int], int], limit: int, base: int
) -> None:
    start = {tp: base for tp in lag}
    latest = {tp: base + n for tp, n in lag.items()}
    end = admit(start, latest, limit)
    assert set(end) == set(latest)
    assert all(start[tp] <= end[tp] <= latest[tp] for tp in latest)
    admitted = sum(end[tp] - start[tp] for tp in latest)
    assert admitted == min(limit, sum(lag.values()))
    total = sum(lag.values())
    for tp, n in lag.items():  # each share is its proportion, rounded one way or the other
        assert abs((end[tp] - start[tp]) - n * min(limit, total) / max(total, 1)) < 1 + 1e-9


def test_admission_control_reaches_the_end_of_every_partition() -> None:
    """Repeated triggers drain every partition, however small its lag next to the others'."""
    start = {("a", 0): 0, ("a", 1): 0, ("b", 0): 0}
    latest = {("a", 0): 100_000, ("a", 1): 1, ("b", 0): 3}
    triggers = 0
    while start != latest:
        end = admit(start, latest, 7)
        assert sum(end.values()) - sum(start.values()) <= 7
        start, triggers = end, triggers + 1
        assert triggers <= 100_000 // 7 + 2
    assert start == latest


def test_new_partitions_are_admitted_from_their_start() -> None:
    end = admit({("a", 0): 10}, {("a", 0): 20, ("a", 1): 5}, 1000)
    assert end == {("a", 0): 20, ("a", 1): 5}


ranges = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 5000)), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(ranges, st.integers(1, 3000), st.none() | st.integers(1, 40))
def test_splitting_covers_each_range_exactly_in_bounded_pieces(
    spans: list[tuple[int, int]], max_offsets: int, min_partitions: int | None
) -> None:
    asked = [OffsetRange("s", i, start, start + size, "s") for i, (start, size) in enumerate(spans) if size]
    pieces = split(asked, max_offsets=max_offsets, min_partitions=min_partitions)
    for r in asked:
        mine = [p for p in pieces if p.partition == r.partition]
        assert [(p.start, p.end) for p in mine] == sorted((p.start, p.end) for p in mine)
        assert mine[0].start == r.start and mine[-1].end == r.end
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))
        assert all(0 < p.size <= max_offsets for p in mine)
    total = sum(r.size for r in asked)
    assert len(pieces) >= min(min_partitions or 0, total)


def test_import_tidelog_does_not_import_pyspark() -> None:
    """The base install has no PySpark: nothing outside tidelog.spark may need it."""
    code = "import sys, tidelog, tidelog.client, tidelog.cli.main; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"
