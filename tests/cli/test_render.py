"""Tables fit 80 columns with three replicas of 16-hex-digit broker ids; ``--wide`` shows the ids in full."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

import tidelog.cli.cluster as cluster_module
from tidelog.cli.cluster import ClusterView, render
from tidelog.cli.render import plain, short_ids
from tidelog.cli.streams import partitions_table, tiered_table
from tidelog.metadata.records import BrokerRecord, ControllerRecord, PartitionRecord
from tidelog.protocol.messages import ListOffsetsResponse, PartitionInfo, StreamInfo

IDS = ("3f9a1c27b04e5d68", "3f9a77e0c1d2b3a4", "c0ffee0123456789")
BIG = 12_345_678_901  # offsets of eleven digits


def lines(renderable: Table, *, width: int = 80) -> list[str]:
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None)
    console.print(renderable)
    return out.getvalue().splitlines()


def stream_info() -> StreamInfo:
    partitions = tuple(
        PartitionInfo(i, IDS[i % 3], IDS, IDS, 7, BIG, BIG + 5, readonly=i == 1, paused=i == 1, log_start=BIG - 100)
        for i in range(3)
    )
    return StreamInfo("a-rather-long-stream-name", "orders.created", partitions)


def test_short_ids_are_the_shortest_unshared_prefixes_of_six_or_more() -> None:
    assert short_ids(IDS) == {IDS[0]: "3f9a1c", IDS[1]: "3f9a77", IDS[2]: "c0ffee"}
    assert short_ids(["3f9a1c27", "3f9a1c99"]) == {"3f9a1c27": "3f9a1c2", "3f9a1c99": "3f9a1c9"}
    assert short_ids(["b0", "b1"]) == {"b0": "b0", "b1": "b1"}
    assert short_ids(IDS, wide=True) == {i: i for i in IDS}


def test_describe_fits_80_columns_and_cuts_nothing() -> None:
    shown = lines(partitions_table(stream_info()))
    assert max(map(len, shown)) <= 80, "\n".join(shown)
    text = "\n".join(shown)
    assert "…" not in text
    for header in ("part", "leader", "replicas", "ISR", "HW", "end", "state"):
        assert header in shown[0]
    assert str(BIG + 5) in text and "read-only" in text


def test_wide_shows_full_ids() -> None:
    text = "\n".join(lines(partitions_table(stream_info(), wide=True), width=250))
    assert all(i in text for i in IDS) and "start" in text and str(BIG - 100) in text


def test_a_tiered_stream_shows_its_remote_and_local_ranges_in_80_columns() -> None:
    partitions = (
        PartitionInfo(
            0,
            IDS[0],
            IDS,
            IDS,
            7,
            BIG,
            BIG + 5,
            log_start=0,
            local_log_start=BIG - 9,
            remote_start=0,
            remote_end=BIG - 9,
        ),
        PartitionInfo(1, IDS[1], IDS, IDS, 7, 40, 40, log_start=0, local_log_start=0),  # nothing offloaded yet
    )
    info = StreamInfo("a-rather-long-stream-name", "orders.created", partitions)
    assert max(map(len, lines(partitions_table(info)))) <= 80
    ranges = tiered_table(info)
    assert ranges is not None and tiered_table(stream_info()) is None  # only a stream with offsets in the store
    shown = lines(ranges)
    assert max(map(len, shown)) <= 80, "\n".join(shown)
    assert "remote" in shown[0] and "local" in shown[0] and "…" not in "\n".join(shown)
    first, second = (line.split() for line in shown[2:4])
    assert f"0..{BIG - 10}" in first and f"{BIG - 9}..{BIG + 4}" in first
    assert "-" in second and "0..39" in second


def test_cluster_status_fits_80_columns() -> None:
    view = ClusterView(
        brokers={i: BrokerRecord(i, "10.0.0.1", 9292, 9293, 0) for i in IDS[:2]},  # the third is down
        controller=ControllerRecord(IDS[0], 4),
        partitions=[PartitionRecord("a-rather-long-stream-name", p, IDS, IDS[p % 3], IDS[:2]) for p in range(3)],
    )
    view.bounds[("a-rather-long-stream-name", 0)] = ListOffsetsResponse(0, BIG, BIG + 3)
    out = io.StringIO()
    saved = cluster_module.console
    cluster_module.console = Console(file=out, width=80, color_system=None)
    try:
        render(view)
    finally:
        cluster_module.console = saved
    shown = out.getvalue().splitlines()
    assert max(map(len, shown)) <= 80, "\n".join(shown)
    assert "…" not in out.getvalue() and "3 under-replicated" in out.getvalue()


def test_json_names_every_field() -> None:
    as_json = plain(stream_info())
    assert as_json["name"] == "a-rather-long-stream-name"
    first = as_json["partitions"][0]
    assert first["replicas"] == list(IDS) and first["high_watermark"] == BIG and first["log_start"] == BIG - 100
