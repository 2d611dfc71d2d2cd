"""Start-up recovery of a real ``tidelog serve``. One SIGKILLed with a damaged batch in the middle of a
single-replica partition's active segment: the intact, acknowledged batches after the damage are kept, the
partition is not opened (CORRUPT_DATA naming the damaged offsets, an ERROR naming the action), until the operator
sets ``recovery_truncate_damaged=true``: then the cut is made, logged with its offsets, and the partition serves.
One whose ``leader-epoch-checkpoint`` was damaged: rebuilt from the batch headers, and the partition serves.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from tidelog.client.admin import Admin
from tidelog.local.cluster import LocalCluster
from tidelog.local.serve_process import ServedBroker, start_served_broker
from tidelog.metadata.records import PartitionRecord
from tidelog.protocol.connection import Connection
from tidelog.protocol.errors import CorruptDataError
from tidelog.protocol.messages import Acks, FetchRequest, FetchResponse, ProduceRequest, ProduceResponse
from tidelog.protocol.records import NewRecord, build_batch, decode_records, iter_batches
from tidelog.testing.history import read_cluster_replica

pytestmark = pytest.mark.slow

STREAM = "damaged"
BATCHES = 15
DAMAGED = 2  # the third batch: twelve intact batches follow it
TIMEOUT = 20.0


async def _connect(broker: ServedBroker | str) -> Connection:
    address = broker if isinstance(broker, str) else broker.wire_address
    host, port = address.rsplit(":", 1)
    return await Connection.open(host, int(port))


async def produce(broker: ServedBroker | str, value: bytes, partition: int = 0) -> int:
    connection = await _connect(broker)
    try:
        batch = build_batch([NewRecord(value=value)], timestamp=time.time_ns())
        response = await connection.request(ProduceRequest(STREAM, partition, Acks.ALL), batch, timeout=TIMEOUT)
    finally:
        await connection.close()
    assert isinstance(response.header, ProduceResponse)
    return response.header.base_offset


async def read(broker: ServedBroker | str, partition: int = 0) -> list[bytes]:
    connection = await _connect(broker)
    try:
        response = await connection.request(FetchRequest(STREAM, partition, 0, max_wait_ms=0), timeout=TIMEOUT)
    finally:
        await connection.close()
    assert isinstance(response.header, FetchResponse) and response.header.error is None
    payload = response.payload
    return [r.value or b"" for p, h in iter_batches(payload) for r in decode_records(payload[p : p + h.size])]


def _flip_a_bit_of_batch(segment: Path, index: int) -> int:
    """Flip one bit in the record section of batch ``index`` (bit rot); return its base offset."""
    data = bytearray(segment.read_bytes())
    batches = iter_batches(bytes(data))  # stops at the zeros written ahead of appends (preallocation)
    position, header = next(itertools.islice(batches, index, None))
    data[position + header.size - 2] ^= 0x10
    segment.write_bytes(bytes(data))
    return header.base_offset


async def test_single_replica_damage_in_the_middle_waits_for_the_operator(tmp_path: Path) -> None:
    broker = await start_served_broker(tmp_path)
    try:
        async with Admin(broker.wire_address) as admin:
            await admin.create_stream(STREAM)
        for i in range(BATCHES):
            assert await produce(broker, b"record-%d" % i) == i  # acknowledged: fsynced (flush always)
        await broker.process.kill()  # SIGKILL: no clean shutdown, recovery scans the active segment
    finally:
        await broker.stop()
    (segment,) = (tmp_path / "data" / "streams").glob(f"{STREAM}@*/0/*.log")
    damaged = _flip_a_bit_of_batch(segment, DAMAGED)
    kept = segment.read_bytes()

    broker = await start_served_broker(tmp_path)
    try:
        with pytest.raises(CorruptDataError) as refused:
            await read(broker)
        message = str(refused.value)
        assert f"{STREAM}/0 was not opened" in message
        assert f"offsets {damaged}..{damaged} unreadable" in message
        assert f"followed by {BATCHES - DAMAGED - 1} intact batch(es)" in message
        assert "recovery_truncate_damaged=true" in message
        with pytest.raises(CorruptDataError):
            await produce(broker, b"refused")
        assert segment.read_bytes() == kept  # nothing cut, nothing appended
        errors = [line for line in broker.process.log_tail(400).splitlines() if "was not opened" in line]
        assert errors and "ERROR" in errors[0]
    finally:
        await broker.stop()

    broker = await start_served_broker(tmp_path, recovery_truncate_damaged="true")  # the operator's word
    try:
        assert await read(broker) == [b"record-%d" % i for i in range(damaged)]
        assert await produce(broker, b"after") == damaged
        cut = [line for line in broker.process.log_tail(400).splitlines() if "cut damaged data" in line]
        assert cut and f"the log now ends at offset {damaged}" in cut[0], broker.process.log_tail()
    finally:
        await broker.stop()


async def test_a_damaged_leader_epoch_checkpoint_is_rebuilt_and_the_partition_serves(tmp_path: Path) -> None:
    broker = await start_served_broker(tmp_path)
    try:
        async with Admin(broker.wire_address) as admin:
            await admin.create_stream(STREAM)
        for i in range(3):
            assert await produce(broker, b"record-%d" % i) == i
    finally:
        await broker.stop()
    (checkpoint,) = (tmp_path / "data" / "streams").glob(f"{STREAM}@*/0/leader-epoch-checkpoint")
    checkpoint.write_bytes(b"\x00garbage\xff" * 8)

    broker = await start_served_broker(tmp_path)
    try:
        assert await produce(broker, b"after") == 3  # led and writable, not "this broker does not lead"
        assert await read(broker) == [b"record-0", b"record-1", b"record-2", b"after"]
        rebuilt = [line for line in broker.process.log_tail(400).splitlines() if "leader-epoch-checkpoint" in line]
        assert rebuilt and "rebuilt from the batch headers" in rebuilt[0] and "WARNING" in rebuilt[0]
    finally:
        await broker.stop()


async def test_a_leader_whose_recovery_found_damage_steps_down_and_fetches_the_range_again(tmp_path: Path) -> None:
    # A long lease: the killed leader comes back before it lapses, so it is still the leader when it recovers.
    settings = {"broker_lease_ttl_ms": "30000", "leader_balance_interval_ms": "3600000"}
    async with LocalCluster(tmp_path, brokers=2, settings=settings) as cluster:
        async with Admin(cluster.bootstrap()) as admin:
            await admin.create_stream(STREAM, partitions=2, replication_factor=2)

        async def records() -> list[PartitionRecord]:
            found = [await cluster.partition_record(STREAM, p) for p in (0, 1)]
            return [r for r in found if r is not None]

        async def settled() -> bool:
            found = await records()
            return len(found) == 2 and all(len(r.isr) == 2 for r in found) and await cluster.controller_id() is not None

        await cluster.wait_until(settled, TIMEOUT, "both partitions in sync and a controller")
        controller = await cluster.controller_id()
        (before,) = [r for r in await records() if r.leader != controller]  # one partition each, as placed
        leader, partition = before.leader, before.id

        async def leading() -> bool:
            return await read(cluster.broker(leader).wire_address, partition) == []

        await cluster.wait_until(leading, TIMEOUT, f"{leader} to lead partition {partition}")
        for i in range(BATCHES):
            assert await produce(cluster.broker(leader).wire_address, b"r%d" % i, partition) == i

        assert controller is not None
        await cluster.pause(controller)  # its fetcher must not report the leader's crash: the leader comes back
        await cluster.kill(leader)
        (segment,) = (cluster.broker(leader).data_dir / "streams").glob(f"{STREAM}@*/{partition}/*.log")
        damaged = _flip_a_bit_of_batch(segment, DAMAGED)
        await cluster.restart(leader)  # still the leader in the metadata, with the other replica in its ISR
        serve_log = cluster.root / leader / "serve.log"
        await cluster.wait_until(lambda: "was not opened" in serve_log.read_text(), TIMEOUT, "the refusal")
        await cluster.resume(controller)

        async def handed_over() -> bool:
            record = await cluster.partition_record(STREAM, partition)
            return record is not None and record.leader == controller and record.leader_epoch > before.leader_epoch

        await cluster.wait_until(handed_over, TIMEOUT, "the damaged leader to step down")
        expected = [b"r%d" % i for i in range(BATCHES)]

        async def serves_every_record() -> bool:  # once it has opened the partition it now leads
            return await read(cluster.broker(controller).wire_address, partition) == expected

        await cluster.wait_until(serves_every_record, TIMEOUT, "the new leader to serve every record")  # none lost

        async def rejoined() -> bool:
            record = await cluster.partition_record(STREAM, partition)
            return record is not None and leader in record.isr

        await cluster.wait_until(rejoined, TIMEOUT, "the damaged replica to fetch the range again and rejoin")
        text = serve_log.read_text()
        assert f"offsets {damaged}..{damaged} unreadable" in text and "steps down" in text
        assert f"the log now ends at offset {damaged}" in text  # the cut, as a follower, logged
        await cluster.kill(leader)
        replica = await read_cluster_replica(cluster, leader, STREAM, partition)
        assert replica is not None and [value for _, value in replica.records] == expected  # fetched again
