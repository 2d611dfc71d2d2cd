"""A batch's registers block: carried beside the records, invisible to every record decoder."""

from __future__ import annotations

import pytest

from tidelog.client.records import FetchedBatch
from tidelog.protocol.records import (
    REGISTERS_FLAG,
    BatchBuilder,
    Codec,
    NewRecord,
    build_batch,
    check_batch,
    decode_records,
    registers_block,
)
from tidelog.protocol.records.errors import CorruptBatchError

RECORDS = [NewRecord(b"v%d" % i, key=b"k", headers=[("h", b"x")]) for i in range(5)]


@pytest.mark.parametrize("codec", list(Codec))
def test_records_decode_the_same_with_and_without_registers(codec: Codec) -> None:
    plain = build_batch(RECORDS, timestamp=1_000, codec=codec)
    carrying = build_batch(RECORDS, timestamp=1_000, codec=codec, registers=b"\x01some-registers")
    header = check_batch(carrying)
    assert header.attributes & REGISTERS_FLAG
    assert bytes(registers_block(carrying) or b"") == b"\x01some-registers"
    assert registers_block(plain) is None
    assert decode_records(carrying) == decode_records(plain)
    fetched = FetchedBatch("s", 0, header, memoryview(carrying), 0)
    assert [r.value for r in fetched.records()] == [r.value for r in RECORDS]


def test_a_block_longer_than_its_batch_is_corrupt() -> None:
    batch = bytearray(build_batch(RECORDS, timestamp=1, registers=b"ab"))
    header = check_batch(batch)
    # claim 60000 bytes of registers: the length is checked against the batch before anything is read
    batch[61:63] = (60000).to_bytes(2, "big")
    with pytest.raises(CorruptBatchError):
        registers_block(batch, header=header)
    with pytest.raises(CorruptBatchError):
        decode_records(batch, header=header)


def test_builder_drain_keeps_offsets_running_across_chunks() -> None:
    builder = BatchBuilder(first_timestamp=50)
    for record in RECORDS[:2]:
        builder.append(record.value)
    first = builder.drain()
    for record in RECORDS[2:]:
        builder.append(record.value)
    second = builder.drain()
    whole = build_batch([NewRecord(r.value) for r in RECORDS], timestamp=50)
    assert first + second == bytes(whole[61:])
