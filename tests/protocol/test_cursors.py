"""Where a cursor lives: Liftbridge's key and its IEEE CRC-32 partitioning, so its clients and ours agree."""

from __future__ import annotations

from tidelog.protocol.cursors import CURSORS_STREAM, cursor_key, cursors_partition


def test_the_key_is_cursor_id_stream_partition() -> None:
    assert cursor_key("reader", "orders", 3) == b"reader,orders,3"
    assert cursor_key("a,b", "s", 0) == b"a,b,s,0"  # as Liftbridge: the id is not escaped
    assert CURSORS_STREAM == "__cursors"


def test_the_partition_is_ieee_crc32_of_the_key_modulo_the_count() -> None:
    assert cursors_partition(b"123456789", 2**32) == 0xCBF43926  # the CRC-32/IEEE check value (not CRC-32C)
    assert cursors_partition(b"123456789", 7) == 0xCBF43926 % 7
    assert {cursors_partition(cursor_key(f"c{i}", "s", 0), 1) for i in range(50)} == {0}
    assert len({cursors_partition(cursor_key(f"c{i}", "s", 0), 4) for i in range(50)}) == 4
