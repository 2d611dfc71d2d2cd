"""Start-up recovery of a real ``tidelog serve``. One SIGKILLed with a damaged batch in the middle of a
single-replica partition's active segment: the intact, acknowledged batches after the damage are kept, the
partition is not opened (CORRUPT_DATA naming the damaged offsets, an ERROR naming the action), until the operator
sets ``recovery_truncate_damaged=true``: then the cut is made, logged with its offsets, and the partition serves.
One whose ``leader-epoch-checkpoint`` was damaged: rebuilt from the batch headers, and the partition serves.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tidelog.api.errors import CorruptDataError
from tidelog.api.wire.messages import Acks, FetchRequest, FetchResponse, ProduceRequest, ProduceResponse
from tidelog.client.admin import Admin
from tidelog.client.connection import Connection
from tidelog.storage.batch import NewRecord, build_batch, decode_records, iter_batches
from tidelog.testing.serve_process import ServedBroker, start_served_broker

pytestmark = pytest.mark.slow

STREAM = "damaged"
BATCHES = 15
DAMAGED = 2  # the third batch: twelve intact batches follow it
TIMEOUT = 20.0


async def _connect(broker: ServedBroker) -> Connection:
    host, port = broker.wire_address.rsplit(":", 1)
    return await Connection.open(host, int(port))


async def produce(broker: ServedBroker, value: bytes) -> int:
    connection = await _connect(broker)
    try:
        batch = build_batch([NewRecord(value=value)], timestamp=time.time_ns())
        response = await connection.request(ProduceRequest(STREAM, 0, Acks.ALL), batch, timeout=TIMEOUT)
    finally:
        await connection.close()
    assert isinstance(response.header, ProduceResponse)
    return response.header.base_offset


async def read(broker: ServedBroker) -> list[bytes]:
    connection = await _connect(broker)
    try:
        response = await connection.request(FetchRequest(STREAM, 0, 0, max_wait_ms=0), timeout=TIMEOUT)
    finally:
        await connection.close()
    assert isinstance(response.header, FetchResponse) and response.header.error is None
    payload = response.payload
    return [r.value or b"" for p, h in iter_batches(payload) for r in decode_records(payload[p : p + h.size])]


def _flip_a_bit_of_batch(segment: Path, index: int) -> int:
    """Flip one bit in the record section of batch ``index`` (bit rot); return its base offset."""
    data = bytearray(segment.read_bytes())
    position, header = list(iter_batches(bytes(data)))[index]
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
