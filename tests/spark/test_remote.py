"""Spark reads offloaded segments straight from the tiered store: planned from etcd, read by the tasks.

A ``tidelog serve`` of its own (a ``file://`` tiered store, its embedded etcd on a known port) offloads a stream
and deletes it from its disk. A batch query with ``tieredStore`` and ``etcd`` reads every offset, in one task per
segment; the broker's count of reads from the store does not move, so the offloaded rows did not come through
it. Planning is also checked alone (no Spark), and the options are refused when they cannot be used.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import aetcd.exceptions
import msgspec
import pytest

pytest.importorskip("pyspark")

from tests.broker.test_secure_links import Pki, TlsEtcd
from tests.helpers import BOUND
from tests.ui.helpers import scrape, value
from tidelog.client import LoopThread, TidelogClient
from tidelog.launch.ports import free_ports
from tidelog.local.serve_process import ServedBroker, start_served_broker
from tidelog.metadata.etcd_client import EtcdTls, open_etcd
from tidelog.metadata.namespace import namespace_keys
from tidelog.metadata.records import StreamRecord, encode
from tidelog.metadata.remote_segments import RemoteSegmentList, remote_key
from tidelog.spark.options import SourceOptionError, parse_options
from tidelog.spark.planning import OffsetRange
from tidelog.spark.remote import _segment_lists, _segment_tasks
from tidelog.storage.remote_segment import RemoteSegment

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.slow

STREAM = "history"
COUNT = 200


class Tiered:
    def __init__(self, broker: ServedBroker, etcd_port: int, store: Path) -> None:
        self.broker = broker
        self.options = {
            "brokers": broker.wire_address,
            "streams": STREAM,
            "tieredStore": f"file://{store}",
            "etcd": f"127.0.0.1:{etcd_port}",
        }


@pytest.fixture(scope="module")
def tiered(broker_thread: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiered]:
    workdir = tmp_path_factory.mktemp("tiered-broker")
    store = workdir / "store"
    (etcd_port,) = free_ports(1)
    settings = {"tiered_store": f"file://{store}", "tiered_interval_ms": "100", "cleaner_interval_ms": "100"}
    broker = broker_thread.run(start_served_broker(workdir, embedded_etcd_port=str(etcd_port), **settings), 120)
    try:
        yield Tiered(broker, etcd_port, store)
    finally:
        broker_thread.run(broker.stop(), timeout=60)


def offloaded(client: TidelogClient) -> tuple[int, int]:
    """Write the stream, then wait until its sealed segments are offloaded and gone from the broker's disk:
    (the offloaded end, the high watermark)."""
    client.admin.create_stream(STREAM, STREAM, config={"segment_max_bytes": 4096, "local_retention_bytes": 1})
    with client.producer(batch_size=1024) as producer:  # batches well below a segment
        for future in [producer.send(STREAM, b"value-%04d" % i * 20, partition=0) for i in range(COUNT)]:
            future.result(BOUND)
    until = time.monotonic() + BOUND
    while time.monotonic() < until:
        p = client.admin.describe_stream(STREAM).partitions[0]
        if p.remote_end > COUNT // 2 and p.local_log_start >= p.remote_end:
            return p.remote_end, p.high_watermark
        time.sleep(0.1)  # polling a condition, bounded by BOUND
    raise AssertionError(f"not offloaded within {BOUND} s: {p}")


def test_a_batch_query_reads_offloaded_segments_from_the_store_not_the_broker(
    spark: SparkSession, broker_thread: LoopThread, tiered: Tiered
) -> None:
    with TidelogClient(tiered.broker.wire_address) as client:
        _, hw = offloaded(client)
    base = f"http://127.0.0.1:{tiered.broker.http_port}"
    before = value(broker_thread.run(scrape(base), BOUND), "tidelog_tiered_remote_reads_total")
    df = spark.read.format("tidelog").options(**tiered.options).option("maxOffsetsPerSplit", COUNT // 2).load()
    assert df.rdd.getNumPartitions() >= 3  # tasks of whole segments in each half, and the local rest
    rows = sorted((r["offset"], bytes(r["value"])) for r in df.select("offset", "value").collect())
    assert rows == [(i, b"value-%04d" % i * 20) for i in range(hw)]
    after = value(broker_thread.run(scrape(base), BOUND), "tidelog_tiered_remote_reads_total")
    assert before == after  # offsets 0..remote_end-1 came from the store, not through the broker


def segment(base: int, end: int) -> RemoteSegment:
    return RemoteSegment(f"p/{base:020d}", base, end, 100, "00", ((0, 0),), -1)


def test_planning_cuts_the_offloaded_part_into_tasks_of_whole_segments() -> None:
    segments = [segment(0, 10), segment(10, 20), segment(20, 30), segment(30, 45)]
    task = OffsetRange("s", 0, 5, 50, "s")
    tasks = _segment_tasks(task, segments, 45, 20)
    assert [(t.start, t.end, len(t.segments)) for t in tasks] == [(5, 20, 2), (20, 30, 1), (30, 45, 1)]
    assert _segment_tasks(OffsetRange("s", 0, 12, 25, "s"), segments, 25, 1000)[0].segments == tuple(segments[1:3])
    assert [(t.start, t.end) for t in _segment_tasks(OffsetRange("s", 0, 12, 25, "s"), segments, 25, 1)] == [
        (12, 20),
        (20, 25),
    ]


def test_tiered_options_are_checked_when_the_query_is_defined() -> None:
    base = {"streams": "s"}
    with pytest.raises(SourceOptionError, match="etcd"):
        parse_options({**base, "tieredStore": "s3://bucket"})
    with pytest.raises(SourceOptionError, match="tieredStore"):
        parse_options({**base, "tieredStore": "ftp://x", "etcd": "127.0.0.1:2379"})
    with pytest.raises(SourceOptionError, match="applies with tieredStore only"):
        parse_options({**base, "etcd": "127.0.0.1:2379"})
    with pytest.raises(SourceOptionError, match="secretAccessKey"):
        parse_options({**base, "tieredStore": "s3://b", "etcd": "h:1", "tieredStore.accessKeyId": "k"})
    parsed = parse_options({**base, "tieredStore": "s3://b", "etcd": "h:1,g:2", "namespace": "prod"})
    assert parsed.tiered is not None and parsed.tiered.etcd == (("h", 1), ("g", 2))


async def test_the_driver_reads_the_segment_lists_from_an_etcd_that_requires_tls(tmp_path: Path) -> None:
    """``etcd.tls.*``: the lists are read over TLS with a client certificate; without them the etcd refuses."""
    pki = Pki(tmp_path)
    etcd = TlsEtcd(
        tmp_path / "etcd",
        extra_args=[
            "--cert-file", str(pki.server_cert), "--key-file", str(pki.server_key),
            "--trusted-ca-file", str(pki.ca_file), "--client-cert-auth",
        ],
    )  # fmt: skip
    await etcd.start()
    try:
        keys = namespace_keys("tidelog")
        tls = EtcdTls.from_files(pki.ca_file, pki.client_cert, pki.client_key)
        writer = open_etcd([("127.0.0.1", etcd.client_port)], timeout=10, tls=tls)
        await writer.connect()
        stream = StreamRecord(STREAM, STREAM, STREAM, 1, 1, created_ns=7)
        await writer.put(keys.stream(STREAM), encode(stream))
        listed = RemoteSegmentList((segment(0, 10), segment(10, 20)), stream_created_ns=7, offloaded_end=20)
        await writer.put(remote_key(keys, STREAM, 0), msgspec.msgpack.encode(listed))
        await writer.close()

        options = {"streams": STREAM, "tieredStore": "s3://b", "etcd": f"127.0.0.1:{etcd.client_port}"}
        secured = {
            **options,
            "etcd.tls.ca": str(pki.ca_file),
            "etcd.tls.cert": str(pki.client_cert),
            "etcd.tls.key": str(pki.client_key),
        }
        tiered = parse_options(secured).tiered
        assert tiered is not None
        found = await _segment_lists(tiered, [(STREAM, 0)])
        assert [s.base_offset for s in found[(STREAM, 0)]] == [0, 10]

        plain = parse_options(options).tiered
        assert plain is not None
        with pytest.raises(aetcd.exceptions.ConnectionFailedError):  # a TLS etcd does not answer a clear dial
            await _segment_lists(plain, [(STREAM, 0)])
    finally:
        await etcd.stop()


def test_etcd_security_options_are_checked_when_the_query_is_defined(tmp_path: Path) -> None:
    base = {"streams": "s", "tieredStore": "s3://b", "etcd": "h:1"}
    with pytest.raises(SourceOptionError, match=r"etcd\.tls\.ca"):
        parse_options({**base, "etcd.tls.ca": str(tmp_path / "missing.pem")})
    with pytest.raises(SourceOptionError, match="needs TLS"):
        parse_options({**base, "etcd.username": "spark", "etcd.password": "pw"})
    with pytest.raises(SourceOptionError, match=r"etcd\.password"):
        parse_options({**base, "etcd.username": "spark"})
    with pytest.raises(SourceOptionError, match="applies with tieredStore only"):
        parse_options({"streams": "s", "etcd.tls.ca": "x"})
    ca = tmp_path / "ca.pem"
    ca.write_text("-")
    parsed = parse_options({**base, "etcd.tls.ca": str(ca), "etcd.username": "spark", "etcd.password": "pw"})
    assert parsed.tiered is not None and parsed.tiered.etcd_credentials == ("spark", "pw")
    assert "pw" not in repr(parsed)
