"""A three-broker cluster with TLS everywhere (client certificates required, TLS between brokers): the native
client, the gRPC stubs and a Liftbridge client by others work over TLS, replication works, and nothing answers
in clear.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio

from tests.helpers import BOUND, LONG_BOUND
from tidelog.client import Admin, Cluster, Consumer, Producer
from tidelog.local.cluster import LocalCluster
from tidelog.local.serve_process import grpc_credentials
from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.protocol.connection import Connection, ConnectionClosedError
from tidelog.protocol.messages import MetadataRequest
from tidelog.protocol.tls import TlsFiles, client_context

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    started = LocalCluster(tmp_path_factory.mktemp("tls-cluster"), 3, tls=True)
    await started.start()
    try:
        yield started
    finally:
        await started.stop()


async def test_native_client_produces_and_consumes_replicated_over_tls(cluster: LocalCluster) -> None:
    tls = Cluster(cluster.bootstrap(), ssl=cluster.client_ssl())
    async with Admin(cluster=tls) as admin:
        await admin.create_stream("secure", partitions=1, replication_factor=3)
    async with Producer(cluster=tls) as producer:
        for i in range(20):
            await producer.send_and_wait("secure", f"v{i}".encode())

    # Replication over TLS: the committed records reached every replica, so the ISR is all three brokers.
    async def in_sync() -> bool:
        record = await cluster.partition_record("secure", 0)
        return record is not None and len(record.isr) == 3

    await cluster.wait_until(in_sync, LONG_BOUND, "every replica of secure/0 to be in sync over TLS")
    consumer = Consumer(stream="secure", cluster=tls, start="earliest")
    values = []
    async with asyncio.timeout(BOUND):
        async for record in consumer:
            values.append(record.value)
            if len(values) == 20:
                break
    await consumer.close()
    await tls.close()
    assert values == [f"v{i}".encode() for i in range(20)]


async def test_grpc_stubs_over_tls(cluster: LocalCluster) -> None:
    files = cluster.client_tls
    assert files is not None
    address = cluster.brokers[0].grpc_address
    async with grpc.aio.secure_channel(address, grpc_credentials(files)) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        await stub.CreateStream(
            api_pb2.CreateStreamRequest(subject="grpc-secure", name="grpc-secure", partitions=1), timeout=BOUND
        )
        response = await stub.FetchMetadata(api_pb2.FetchMetadataRequest(streams=["grpc-secure"]), timeout=BOUND)
    assert [s.name for s in response.streamMetadata] == ["grpc-secure"]


async def test_grpc_without_client_certificate_is_refused(cluster: LocalCluster) -> None:
    files = cluster.client_tls
    assert files is not None
    address = cluster.brokers[0].grpc_address
    async with grpc.aio.secure_channel(address, grpc_credentials(TlsFiles(ca=files.ca))) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await api_pb2_grpc.APIStub(channel).FetchMetadata(api_pb2.FetchMetadataRequest(), timeout=5)
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE


async def test_plaintext_clients_are_refused_on_both_ports(cluster: LocalCluster) -> None:
    broker = cluster.brokers[0]
    connection = await Connection.open("127.0.0.1", broker.wire_port, connect_timeout=BOUND)
    with pytest.raises(ConnectionClosedError, match="is it a TLS port"):
        await connection.request(MetadataRequest(), timeout=BOUND)
    await connection.close()
    async with grpc.aio.insecure_channel(broker.grpc_address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await api_pb2_grpc.APIStub(channel).FetchMetadata(api_pb2.FetchMetadataRequest(), timeout=5)
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE


async def test_the_http_port_serves_only_tls(cluster: LocalCluster) -> None:
    """/healthz answers a client with a certificate over TLS; a plain HTTP request gets no answer."""
    broker = cluster.brokers[0]
    context = cluster.client_ssl()
    reader, writer = await asyncio.open_connection("127.0.0.1", broker.http_port, ssl=context)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    async with asyncio.timeout(BOUND):
        answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200")
    reader, writer = await asyncio.open_connection("127.0.0.1", broker.http_port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    async with asyncio.timeout(BOUND):
        answer = await reader.read()
    writer.close()
    assert not answer.startswith(b"HTTP/1.1 200")


async def test_wire_client_without_certificate_is_refused_precisely(cluster: LocalCluster) -> None:
    files = cluster.client_tls
    assert files is not None
    broker = cluster.brokers[0]
    anonymous = client_context(TlsFiles(ca=files.ca))
    with pytest.raises(ConnectionClosedError) as refused:
        connection = await Connection.open("127.0.0.1", broker.wire_port, ssl=anonymous, connect_timeout=BOUND)
        try:
            await connection.request(MetadataRequest(), timeout=BOUND)
        finally:
            await connection.close()
    assert "refused ours" in str(refused.value)


async def test_the_spark_source_reads_over_tls(cluster: LocalCluster) -> None:
    pytest.importorskip("pyarrow")
    from tidelog.spark.options import parse_options
    from tidelog.spark.planning import OffsetRange
    from tidelog.spark.reading import read_range

    files = cluster.client_tls
    assert files is not None and files.ca and files.cert and files.key
    tls = Cluster(cluster.bootstrap(), ssl=cluster.client_ssl())
    async with Admin(cluster=tls) as admin:
        await admin.create_stream("spark-secure", partitions=1, replication_factor=1)
    async with Producer(cluster=tls) as producer:
        for i in range(5):
            await producer.send_and_wait("spark-secure", f"s{i}".encode())
    await tls.close()
    options = parse_options(
        {
            "brokers": ",".join(cluster.bootstrap()),
            "streams": "spark-secure",
            "tls.ca": str(files.ca),
            "tls.cert": str(files.cert),
            "tls.key": str(files.key),
        }
    )
    task = OffsetRange("spark-secure", 0, 0, 5, "spark-secure")
    batches = await asyncio.to_thread(lambda: list(read_range(options, task)))  # it runs a loop of its own
    values = [v for batch in batches for v in batch.column("value").to_pylist()]
    assert values == [f"s{i}".encode() for i in range(5)]


async def test_the_spark_sink_writes_over_tls(cluster: LocalCluster) -> None:
    pa = pytest.importorskip("pyarrow")
    from tidelog.spark.sink_commit import commit_task
    from tidelog.spark.sink_options import SinkColumns, parse_sink_options
    from tidelog.spark.writing import write_task

    files = cluster.client_tls
    assert files is not None and files.ca and files.cert and files.key
    tls = Cluster(cluster.bootstrap(), ssl=cluster.client_ssl())
    async with Admin(cluster=tls) as admin:
        await admin.create_stream("sink-secure", partitions=1, replication_factor=1)
    options = parse_sink_options(
        {
            "brokers": ",".join(cluster.bootstrap()),
            "stream": "sink-secure",
            "tls.ca": str(files.ca),
            "tls.cert": str(files.cert),
            "tls.key": str(files.key),
        }
    )
    rows = pa.RecordBatch.from_pydict({"value": [b"a", b"b", b"c"]})
    columns = SinkColumns(value="value", value_type="binary")

    def write_and_commit() -> None:  # what a Spark task of a batch write does, with a loop of its own
        task = write_task(options, columns, iter([rows]), task_index=0, query_id=None)
        commit_task(options, task, None, 0)

    await asyncio.to_thread(write_and_commit)
    consumer = Consumer(stream="sink-secure", cluster=tls, start="earliest")
    values = []
    async with asyncio.timeout(BOUND):
        async for record in consumer:
            values.append(record.value)
            if len(values) == 3:
                break
    await consumer.close()
    await tls.close()
    assert values == [b"a", b"b", b"c"]


async def test_acls_are_on_and_a_change_reaches_every_broker(cluster: LocalCluster) -> None:
    """ACLs are on by default under required client certificates: the principal 'client' is refused on every
    broker until an entry written to etcd allows it, then allowed on every broker (each follows etcd's watch);
    the super user 'admin' (the cluster's client_tls) needed no entry for the tests above."""
    from tidelog.metadata.acl_records import AclEntry, Operation, Permission, ResourceType, add_acl, remove_acls
    from tidelog.protocol.errors import PermissionDeniedError

    user = cluster.user_tls
    assert user is not None
    context = client_context(user)

    async def describe(port: int) -> BaseException | None:
        connection = await Connection.open("127.0.0.1", port, ssl=context, connect_timeout=BOUND)
        try:
            await connection.request(MetadataRequest(("secure",)), timeout=BOUND)
        except PermissionDeniedError as exc:
            return exc
        finally:
            await connection.close()
        return None

    for broker in cluster.brokers:
        refused = await describe(broker.wire_port)
        assert isinstance(refused, PermissionDeniedError) and "principal client may not describe stream" in str(refused)
    grant = AclEntry("client", ResourceType.STREAM, "secure", Operation.READ, Permission.ALLOW)
    etcd = await cluster.etcd_client()
    try:
        await add_acl(etcd, cluster.keys, grant)
        for broker in cluster.brokers:
            port = broker.wire_port

            async def allowed(port: int = port) -> bool:
                return await describe(port) is None

            await cluster.wait_until(allowed, BOUND, f"broker {broker.id} to apply the new ACL entry")
        await remove_acls(etcd, cluster.keys, [grant])
        for broker in cluster.brokers:
            port = broker.wire_port

            async def refused_again(port: int = port) -> bool:
                return await describe(port) is not None

            await cluster.wait_until(refused_again, BOUND, f"broker {broker.id} to apply the removal")
    finally:
        await etcd.close()
