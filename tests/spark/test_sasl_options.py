"""The ``sasl.username``/``sasl.password`` options of the Spark source and sink: checked on the driver (both or
neither, over TLS only, never in a repr), and a task's reads, writes and the driver's commit log in as the user on
a real broker with ACLs (TLS, no client certificate)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
import trustme

from tests.broker.conftest import broker_config
from tests.helpers import BOUND
from tidelog.client import Admin, Cluster, Consumer, Producer
from tidelog.metadata.acl_records import CLUSTER_NAME, AclEntry, Operation, Pattern, Permission, ResourceType, add_acl
from tidelog.metadata.namespace import namespace_keys
from tidelog.metadata.user_records import make_user, put_user
from tidelog.protocol.errors import PermissionDeniedError
from tidelog.protocol.tls import TlsFiles, client_context
from tidelog.server import Broker
from tidelog.spark.options import SourceOptionError, parse_options
from tidelog.spark.sink_options import SinkOptionError, parse_sink_options

KEYS = namespace_keys()
GRANTS = [
    AclEntry("etl", ResourceType.STREAM, "spark-", Operation.ALL, Permission.ALLOW, Pattern.PREFIXED),
    AclEntry("etl", ResourceType.CLUSTER, CLUSTER_NAME, Operation.ALL, Permission.ALLOW),
]


def test_credentials_are_checked_on_the_driver(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    both = {"sasl.username": "etl", "SASL.PASSWORD": "pw", "tls.ca": str(ca)}
    source = parse_options({"streams": "s", **both})
    sink = parse_sink_options({"stream": "s", **both})
    assert source.credentials == sink.credentials == ("etl", "pw")
    assert "pw" not in repr(source) and "pw" not in repr(sink)
    assert parse_options({"streams": "s"}).credentials is None
    with pytest.raises(SourceOptionError, match=r"'sasl.password': is missing or empty"):
        parse_options({"streams": "s", "sasl.username": "etl", "tls.ca": str(ca)})
    with pytest.raises(SinkOptionError, match=r"'sasl.username': names no user"):
        parse_sink_options({"stream": "s", "sasl.password": "pw", "tls.ca": str(ca)})
    with pytest.raises(SinkOptionError, match=r"'sasl.username': a password login needs TLS \(tls.ca\)"):
        parse_sink_options({"stream": "s", "sasl.username": "etl", "sasl.password": "pw"})


@dataclass
class Setup:
    broker: Broker
    ca: Path

    @property
    def brokers(self) -> str:
        assert self.broker.wire is not None
        return f"127.0.0.1:{self.broker.wire.port}"

    def cluster(self) -> Cluster:
        return Cluster(self.brokers, ssl=client_context(TlsFiles(ca=self.ca)), credentials=("etl", "s3cret"))


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def setup(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Setup]:
    directory: Path = tmp_path_factory.mktemp("spark-sasl")
    ca = trustme.CA()
    ca_file = directory / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    leaf = ca.issue_cert("127.0.0.1", "localhost", common_name="broker")
    cert, key = directory / "broker.pem", directory / "broker.key"
    cert.write_bytes(b"".join(b.bytes() for b in leaf.cert_chain_pems))
    key.write_bytes(leaf.private_key_pem.bytes())
    broker = Broker(
        broker_config(
            directory / "data",
            tls_cert=cert,
            tls_key=key,
            tls_client_ca=ca_file,
            tls_ca=ca_file,
            tls_client_auth="optional",
            authz_enabled=True,
        )
    )
    await broker.start()
    try:
        await put_user(broker.etcd, KEYS, make_user("etl", "s3cret"))
        for grant in GRANTS:
            await add_acl(broker.etcd, KEYS, grant)
        assert broker.acls is not None
        await broker.acls.wait_for(lambda m: len(m.entries) >= len(GRANTS), BOUND)
        yield Setup(broker, ca_file)
    finally:
        await broker.stop()


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_the_source_reads_as_the_user(setup: Setup) -> None:
    pytest.importorskip("pyarrow")
    from tidelog.spark.planning import OffsetRange
    from tidelog.spark.reading import read_range

    cluster = setup.cluster()
    async with Admin(cluster=cluster) as admin:
        await admin.create_stream("spark-read", partitions=1)
    async with Producer(cluster=cluster) as producer:
        for i in range(3):
            await producer.send_and_wait("spark-read", f"r{i}".encode())
    await cluster.close()
    given = {"brokers": setup.brokers, "streams": "spark-read", "tls.ca": str(setup.ca)}
    task = OffsetRange("spark-read", 0, 0, 3, "spark-read")
    anonymous = parse_options(given)
    with pytest.raises(PermissionDeniedError, match="principal ANONYMOUS"):
        await asyncio.to_thread(lambda: list(read_range(anonymous, task)))
    options = parse_options({**given, "sasl.username": "etl", "sasl.password": "s3cret"})
    batches = await asyncio.to_thread(lambda: list(read_range(options, task)))  # it runs a loop of its own
    assert [v for batch in batches for v in batch.column("value").to_pylist()] == [b"r0", b"r1", b"r2"]


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_the_sink_writes_and_commits_as_the_user(setup: Setup) -> None:
    pa = pytest.importorskip("pyarrow")
    from tidelog.spark.sink_commit import commit_task
    from tidelog.spark.sink_options import SinkColumns
    from tidelog.spark.writing import write_task

    cluster = setup.cluster()
    async with Admin(cluster=cluster) as admin:
        await admin.create_stream("spark-write", partitions=1)
    options = parse_sink_options(
        {
            "brokers": setup.brokers,
            "stream": "spark-write",
            "tls.ca": str(setup.ca),
            "sasl.username": "etl",
            "sasl.password": "s3cret",
        }
    )
    rows = pa.RecordBatch.from_pydict({"value": [b"a", b"b"]})
    columns = SinkColumns(value="value", value_type="binary")

    def write_and_commit() -> None:  # what a Spark task of a batch write does, with a loop of its own
        task = write_task(options, columns, iter([rows]), task_index=0, query_id=None)
        commit_task(options, task, None, 0)

    await asyncio.to_thread(write_and_commit)
    consumer = Consumer(stream="spark-write", cluster=cluster, start="earliest")
    values = []
    async with asyncio.timeout(BOUND):
        async for record in consumer:
            values.append(record.value)
            if len(values) == 2:
                break
    await consumer.close()
    await cluster.close()
    assert values == [b"a", b"b"]
