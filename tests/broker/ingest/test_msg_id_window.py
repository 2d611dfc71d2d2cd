"""The Nats-Msg-Id window on its own, the encoder using it, and its rebuild from a real log."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.broker.helpers import garble_first_record
from tidelog.broker.ingest.encoder import Decoded, IngestEncoder, Message
from tidelog.broker.ingest.msg_id_window import MAX_ID_BYTES, PENDING, MsgIdWindow, msg_id_of, rebuild
from tidelog.broker.ingest.natsproto import Msg, parse_headers
from tidelog.protocol.records import (
    NewRecord,
    build_batch,
    iter_batches,
    records_of,
)
from tidelog.storage.config import LogConfig
from tidelog.storage.log import Log

SECOND = 1_000_000_000
T0 = 1_700_000_000 * SECOND


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([("Nats-Msg-Id", b"a1")], b"a1"),
        ([("X", b"1"), ("Nats-Msg-Id", b"  a1 "), ("Nats-Msg-Id", b"b2")], b"a1"),  # the first one, trimmed
        ([("Nats-Msg-Id", b"")], None),
        ([("Nats-Msg-Id", b" \t ")], None),
        ([("Nats-Msg-Id", b"x" * (MAX_ID_BYTES + 1))], None),
        ([("Nats-Msg-Id", b"x" * MAX_ID_BYTES)], b"x" * MAX_ID_BYTES),
        ([("nats-msg-id", b"a1")], None),  # case-sensitive, as in JetStream
        ([], None),
    ],
)
def test_msg_id_of(headers: list[tuple[str, bytes]], expected: bytes | None) -> None:
    assert msg_id_of(headers) == expected


def test_a_malformed_header_line_carries_no_id() -> None:
    assert msg_id_of(parse_headers(b"NATS/1.0\r\nNats-Msg-Id a1\r\n\r\n")) is None  # no colon: skipped
    assert msg_id_of(parse_headers(b"NATS/1.0\r\nNats-Msg-Id:\r\n\r\n")) is None
    assert msg_id_of(parse_headers(b"NATS/1.0\r\nNats-Msg-Id: a1\r\n\r\n")) == b"a1"


def test_ids_are_duplicates_within_the_window_only() -> None:
    window = MsgIdWindow(10 * SECOND)
    assert window.duplicate_of(b"a", T0) is None
    entry = window.add(b"a", T0)
    assert entry.offset == PENDING
    window.stored(entry, 7)
    assert window.duplicate_of(b"a", T0 + 10 * SECOND - 1) is entry
    assert window.duplicate_of(b"b", T0 + 1) is None
    assert window.duplicate_of(b"a", T0 + 10 * SECOND) is None  # expired: gone from memory too
    assert len(window) == 0


def test_a_forgotten_id_is_new_again() -> None:
    window = MsgIdWindow(10 * SECOND)
    entry = window.add(b"a", T0)
    window.forget(entry)
    assert window.duplicate_of(b"a", T0 + 1) is None
    again = window.add(b"a", T0 + 2)
    window.forget(entry)  # a stale entry forgets nothing
    assert window.duplicate_of(b"a", T0 + 3) is again


def test_beyond_max_entries_the_oldest_are_forgotten() -> None:
    window = MsgIdWindow(100 * SECOND, max_entries=3)
    for i in range(5):
        window.add(b"%d" % i, T0 + i)
    assert len(window) == 3 and window.evicted == 2
    assert [window.duplicate_of(b"%d" % i, T0 + 10) is not None for i in range(5)] == [False, False, True, True, True]


@pytest.mark.parametrize(("window_ns", "max_entries"), [(0, 1), (1, 0)])
def test_limits_are_checked(window_ns: int, max_entries: int) -> None:
    with pytest.raises(ValueError):
        MsgIdWindow(window_ns, max_entries=max_entries)


# ---------------------------------------------------------------------------------------------- the encoder


def with_id(msg_id: str, payload: bytes, reply: str = "") -> Decoded:
    return Decoded("s", reply, payload, [("Nats-Msg-Id", msg_id.encode())])


def hmsg(msg_id: bytes, payload: bytes) -> Msg:
    return Msg(b"s", b"1", b"", payload, b"NATS/1.0\r\nNats-Msg-Id: " + msg_id + b"\r\n\r\n")


def stored_values(data: bytearray) -> list[bytes]:
    return [r.value or b"" for r in records_of(bytes(data))]


def test_the_encoder_leaves_duplicates_out_within_a_read_and_across_reads() -> None:
    window = MsgIdWindow(10 * SECOND)
    encoder = IngestEncoder("s", max_batch_bytes=1 << 20, max_batch_records=100, window=window)
    first: list[Message] = [hmsg(b"a", b"1"), memoryview(b"plain"), hmsg(b"a", b"1 again"), with_id("b", b"2")]
    encoded = encoder.encode(first, T0)
    assert stored_values(encoded.data) == [b"1", b"plain", b"2"]
    assert [(i, e.msg_id) for i, e in encoded.ids] == [(0, b"a"), (2, b"b")]
    assert [(e.msg_id, ack) for e, ack in encoded.duplicates] == [(b"a", None)]
    assert [r.timestamp for r in records_of(bytes(encoded.data))] == [T0, T0 + 1, T0 + 2]  # no gap for the dup

    second = encoder.encode([with_id("b", b"2 again"), with_id("c", b"3"), hmsg(b"", b"no id")], T0 + SECOND)
    assert stored_values(second.data) == [b"3", b"no id"]
    third = encoder.encode([hmsg(b"a", b"1 late")], T0 + 10 * SECOND)  # the window has passed
    assert stored_values(third.data) == [b"1 late"]


def test_without_a_window_ids_are_ordinary_headers() -> None:
    encoder = IngestEncoder("s", max_batch_bytes=1 << 20, max_batch_records=100)
    encoded = encoder.encode([hmsg(b"a", b"1"), hmsg(b"a", b"1")], T0)
    assert stored_values(encoded.data) == [b"1", b"1"]
    assert [r.headers for r in records_of(bytes(encoded.data))] == [(("Nats-Msg-Id", b"a"),)] * 2
    assert not encoded.ids and not encoded.duplicates


def test_an_id_too_large_to_store_is_not_entered() -> None:
    window = MsgIdWindow(10 * SECOND)
    encoder = IngestEncoder("s", max_batch_bytes=200, max_batch_records=100, window=window)
    encoded = encoder.encode([hmsg(b"a", b"x" * 300), hmsg(b"a", b"small")], T0)
    assert len(encoded.too_large) == 1
    assert stored_values(encoded.data) == [b"small"]


# ---------------------------------------------------------------------------------------------- rebuild


async def test_rebuild_finds_the_ids_stored_within_the_window(tmp_path: Path) -> None:
    log = await Log.open_async(tmp_path / "log", LogConfig(segment_max_bytes=4096))
    try:

        async def append(timestamp: int, *records: NewRecord) -> None:
            await log.append(build_batch(list(records), timestamp=timestamp), 0)

        def idr(msg_id: bytes, timestamp: int) -> NewRecord:
            return NewRecord(b"v", headers=[("Nats-Msg-Id", msg_id)], timestamp=timestamp)

        await append(T0, idr(b"old", T0), NewRecord(b"plain", timestamp=T0 + 1))
        for i in range(50):  # plain batches over several segments: skipped without decoding
            await append(T0 + 5 * SECOND + i, NewRecord(b"x" * 200, timestamp=T0 + 5 * SECOND + i))
        await append(T0 + 9 * SECOND, idr(b"edge", T0 + 9 * SECOND), idr(b"new", T0 + 11 * SECOND))
        await append(T0 + 12 * SECOND, idr(b"", T0 + 12 * SECOND), idr(b"last", T0 + 12 * SECOND + 1))

        window = MsgIdWindow(10 * SECOND)
        window.add(b"stale", T0 + 19 * SECOND)  # whatever was there goes
        now = T0 + 19 * SECOND
        assert await rebuild(window, log, now) == 2
        new, last = window.duplicate_of(b"new", now), window.duplicate_of(b"last", now)
        assert new is not None and last is not None
        assert (new.offset, last.offset) == (log.end_offset - 3, log.end_offset - 1)
        assert all(window.duplicate_of(i, now) is None for i in (b"old", b"edge", b"stale"))
    finally:
        await log.close()


async def test_rebuild_of_an_empty_log(tmp_path: Path) -> None:
    log = await Log.open_async(tmp_path / "log", LogConfig())
    try:
        assert await rebuild(MsgIdWindow(SECOND), log, T0) == 0
    finally:
        await log.close()


def segment_batches(log: Log) -> list[tuple[Path, int, int, int]]:
    """(segment file, position, base offset, size) of every batch on disk, in offset order."""
    found = []
    for path in sorted(log.directory.glob("*.log")):
        data = path.read_bytes()
        for position, header in iter_batches(data, verify=False):
            found.append((path, position, header.base_offset, header.size))
    return found


@pytest.mark.parametrize("fix_crc", [True, False], ids=["records-do-not-decode", "crc-mismatch"])
async def test_rebuild_skips_a_batch_it_cannot_read(
    tmp_path: Path, fix_crc: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """An unreadable batch costs the window its own ids only: those before and after it are found."""
    config = LogConfig(segment_max_bytes=4096)
    log = await Log.open_async(tmp_path / "log", config)
    ids = [b"id-%03d" % i for i in range(60)]
    try:
        for i, msg_id in enumerate(ids):
            record = NewRecord(b"v" * 100, headers=[("Nats-Msg-Id", msg_id)], timestamp=T0 + i)
            await log.append(build_batch([record], timestamp=T0 + i), 0)
    finally:
        await log.close()
    batches = segment_batches(log)
    sealed = [b for b in batches if b[0] != batches[-1][0]]
    path, position, damaged, size = sealed[len(sealed) // 2]  # a batch in the middle of a sealed segment
    garble_first_record(path, position, size, fix_crc=fix_crc)
    log = await Log.open_async(tmp_path / "log", config)
    try:
        window = MsgIdWindow(10 * SECOND)
        assert await rebuild(window, log, T0 + 5 * SECOND) == len(ids) - 1
        assert [i for i, msg_id in enumerate(ids) if window.duplicate_of(msg_id, T0 + SECOND) is None] == [damaged]
        assert f"{damaged}..{damaged}" in caplog.text
        # The window starting right in the damaged batch: the lookup of its first offset meets the damage too.
        now = T0 + damaged + 10 * SECOND - 1
        assert await rebuild(window, log, now) == len(ids) - 1 - damaged
    finally:
        await log.close()
