"""Fuzz targets: each decoder of bytes that come from outside, wrapped under :mod:`tidelog.testing.fuzz_contract`.

=======================  ===================================================  ==================================
target                   what it decodes                                      its one error (in ``tidelog.``)
=======================  ===================================================  ==================================
``wire_frames``          a byte stream into frames, whole and in pieces, and  ``protocol.frames.ProtocolError``
                         each frame's msgpack header by its (kind, op)
``wire_headers``         one msgpack header of a chosen (kind, op)            ``protocol.frames.ProtocolError``
``record_batches``       a produce payload: the produce check, then each      ``protocol.records.errors.``
                         batch's records by the canonical decoder and the     ``RecordFormatError``
                         consumer's, which must agree
``liftbridge_envelope``  a NATS message that may carry a Liftbridge envelope  ``protocol.liftbridge.``
                                                                              ``RefusedEnvelopeError``
``nats_protocol``        what a NATS server sends a subscriber, whole and in  ``broker.ingest.natsproto.``
                         pieces, HMSG headers and INFO included               ``ProtocolError``
``session_fetch``        a SESSION_FETCH answer's header, and its payload     ``protocol.frames.ProtocolError``
                         split into each partition's batches
``checkpoints``          HW, leader-epoch and producer-snapshot files, the    ``storage.errors.CheckpointError``
                         damaged-ranges registry (:mod:`~tidelog.testing.
                         fuzz_disk_targets`, as the next two)
``segment_recovery``     a partition directory's segment and index files      ``storage.errors.StorageError``
                         when a broker opens it
``staged_segment``       a sealed segment file a follower downloaded from     ``protocol.records.errors.``
                         its leader, checked before it is installed           ``RecordFormatError``
=======================  ===================================================  ==================================

``python -m tidelog.testing.fuzz_targets write-corpus fuzz/corpus`` adds every target's seeds to the committed
corpus; ``replay fuzz/corpus`` checks every corpus file (what CI does, through pytest).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from pathlib import Path

import msgspec
import msgspec.inspect as mi

from tidelog.broker.ingest import natsproto
from tidelog.protocol._gen import api_pb2
from tidelog.protocol.envelope import MessageType, encode_envelope, parse_envelope
from tidelog.protocol.frames import FrameDecoder, Kind, ProtocolError, encode_frame_bytes
from tidelog.protocol.liftbridge import RefusedEnvelopeError, record_from_nats
from tidelog.protocol.message_codec import HEADER_TYPES, decode_as, decode_frame_header, decode_header
from tidelog.protocol.messages import ErrorBody, Header
from tidelog.protocol.records import (
    ENCRYPTED_FLAG,
    BatchHeader,
    Codec,
    NewRecord,
    build_batch,
    check_records,
    crc_ok,
    decode_records,
    iter_batches,
    record_section,
    registers_block,
)
from tidelog.protocol.records.errors import RecordFormatError
from tidelog.protocol.records.rows import parse_records
from tidelog.protocol.session_messages import SessionFetchPartition, SessionFetchResponse, split_payload
from tidelog.storage.batch_check import ProduceLimits, check_produced
from tidelog.testing.fuzz_contract import ContractViolation, Target, replay, same_outcome, write_corpus
from tidelog.testing.fuzz_disk_targets import CHECKPOINTS, SEGMENT_RECOVERY, STAGED_SEGMENT

MAX_FRAME_BYTES = 1024 * 1024
"""The frame limit the wire targets decode with (the broker's default is 64 MiB; the checks are the same)."""

MAX_UNCOMPRESSED = 256 * 1024
"""The decompression bound the record target decodes with (the broker's is 64 MiB; the checks are the same)."""

RECORD_OVERHEAD = 64
"""Bytes a decoded record may cost per byte of its encoding: a 7-byte record becomes a ``Record``, its value's
``bytes`` and a tuple in each of the decoders the target compares, a few hundred bytes of objects."""


def _pieces(data: bytes) -> list[bytes]:
    """``data`` cut into reads of a size its first byte chooses (1 to 64 bytes), as a socket might deliver it."""
    step = 1 + (data[0] % 64 if data else 0)
    return [data[i : i + step] for i in range(0, len(data), step)]


# ------------------------------------------------------------------------------------------------- wire frames


def _frames(chunks: list[bytes]) -> list[tuple[int, int, int, bytes, bytes]]:
    decoder = FrameDecoder(MAX_FRAME_BYTES)
    out: list[tuple[int, int, int, bytes, bytes]] = []
    for chunk in chunks:
        for frame in decoder.feed(chunk):
            out.append((frame.kind, frame.op, frame.correlation_id, bytes(frame.header), bytes(frame.payload)))
            with contextlib.suppress(ProtocolError):  # a bad header in a well-delimited frame: answered, not fatal
                decode_frame_header(frame)
    decoder.eof()
    return out


def _outcome(decode: Callable[[], object], error: type[Exception]) -> object:
    """What ``decode`` returns, or the name of its error type (so two decoders' failures compare equal)."""
    try:
        return decode()
    except error as exc:
        return type(exc).__name__


def decode_wire_frames(data: bytes) -> None:
    whole = _outcome(lambda: _frames([data]), ProtocolError)
    pieces = _outcome(lambda: _frames(_pieces(data)), ProtocolError)
    same_outcome("wire_frames", data, whole, pieces)


def _wire_frame_seeds() -> list[bytes]:
    frames = [encode_frame_bytes(kind, op, 7, _sample_header(HEADER_TYPES[kind, op])) for kind, op in _routes()[:12]]
    produce = encode_frame_bytes(Kind.REQUEST, 1, 1, _sample_header(HEADER_TYPES[Kind.REQUEST, 1]), _sample_batch())
    huge = b"\xff\xff\xff\xff" + frames[0][4:]  # a length prefix claiming 4 GiB
    return [*frames, produce, b"".join(frames[:4]), huge, frames[0][:9]]


# ------------------------------------------------------------------------------------------------- wire headers


def _routes() -> list[tuple[Kind, int]]:
    return sorted(HEADER_TYPES)


def decode_wire_headers(data: bytes) -> None:
    """The first byte picks a (kind, op) route (or an error frame), the rest is that route's header."""
    routes = _routes()
    if not data:
        return
    choice = data[0] % (len(routes) + 1)
    if choice == len(routes):
        decode_header(Kind.ERROR, 0, data[1:])
    else:
        kind, op = routes[choice]
        decode_header(kind, op, data[1:])


def _wire_header_seeds() -> list[bytes]:
    seeds = [bytes([i]) + _sample_header(HEADER_TYPES[route]) for i, route in enumerate(_routes())]
    seeds.append(bytes([len(_routes())]) + msgspec.msgpack.encode(ErrorBody(3, "no such stream", True)))
    return seeds


def _sample_header(cls: type[Header]) -> bytes:
    """A valid header of ``cls``, every field filled with a small value of its type (seeds for the fuzzers)."""
    value = _sample_value(mi.type_info(cls))
    encoded = msgspec.msgpack.encode(value)
    msgspec.msgpack.decode(encoded, type=cls)  # a seed that does not decode would teach the fuzzer nothing
    return encoded


def _sample_value(info: mi.Type) -> object:
    if isinstance(info, mi.StructType):
        return [_sample_value(field.type) for field in info.fields]
    if isinstance(info, mi.IntType):
        return max(1, info.ge or 0) if info.le is None or info.le >= 1 else info.le
    if isinstance(info, mi.StrType):
        return "s" * max(1, info.min_length or 0)
    if isinstance(info, mi.BoolType):
        return True
    if isinstance(info, mi.BytesType):
        return b"b"
    if isinstance(info, mi.EnumType):
        return next(iter(info.cls)).value
    if isinstance(info, mi.UnionType):
        return _sample_value(info.types[0])
    if isinstance(info, mi.ListType | mi.TupleType | mi.VarTupleType | mi.FrozenSetType | mi.SetType):
        return []
    if isinstance(info, mi.DictType):
        return {}
    return None


# ------------------------------------------------------------------------------------------------- session fetch


def decode_session_fetch(data: bytes) -> None:
    """A SESSION_FETCH answer as the follower reads it: the first byte is the header's length, then the header,
    then the payload it splits into each partition's batches."""
    if not data:
        return
    size = data[0]
    header = decode_as(SessionFetchResponse, data[1 : 1 + size])
    split_payload(header, memoryview(data[1 + size :]))


def _session_fetch_seeds() -> list[bytes]:
    parts = (
        SessionFetchPartition("s", 0, 3, 0, 5, 2, 4),
        SessionFetchPartition("s", 1, 0, 0, 0, 2, 0, ErrorBody(10, "out of range", False)),
        SessionFetchPartition("t", 7, 1, 1, 9, 1, 2),
    )
    header = msgspec.msgpack.encode(SessionFetchResponse(parts))
    empty = msgspec.msgpack.encode(SessionFetchResponse())
    return [
        bytes([len(header)]) + header + b"aaaabb",
        bytes([len(header)]) + header + b"aa",
        bytes([len(empty)]) + empty,
    ]


# ------------------------------------------------------------------------------------------------- record batches


PRODUCE_LIMITS = ProduceLimits(
    max_message_bytes=MAX_UNCOMPRESSED, max_uncompressed_bytes=MAX_UNCOMPRESSED, max_timestamp_ahead_ms=3_600_000
)
NOW_NS = 1_800_000_000_000_000_000


def _records_both_ways(data: bytes, pos: int, header: BatchHeader, accepted: bool) -> None:
    """Decode one batch's records with the canonical decoder and the consumer's; they must agree, and decode
    whatever the produce check accepted (a stored batch that does not decode stops every reader at it)."""
    canonical = _outcome(
        lambda: [
            (r.offset, r.timestamp, r.key, r.value, r.headers)
            for r in decode_records(data, pos, header=header, max_uncompressed=MAX_UNCOMPRESSED)
        ],
        RecordFormatError,
    )
    if accepted and isinstance(canonical, str):
        raise ContractViolation(
            "record_batches",
            data,
            f"the produce check accepts a batch at byte {pos} that the canonical decoder refuses ({canonical})",
        )
    if header.attributes & ENCRYPTED_FLAG:
        return  # only a broker with the key reads it: both decoders refuse it the same way
    try:  # decompressed (bounded) when compressed: what the consumer hands its row decoder
        section = bytes(record_section(data, pos, header=header, max_uncompressed=MAX_UNCOMPRESSED))
    except RecordFormatError:
        if not isinstance(canonical, str):
            raise ContractViolation("record_batches", data, "records decode but their section does not") from None
        return
    rows = _outcome(
        lambda: [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in parse_records(section, header, "s", 0)],
        RecordFormatError,
    )
    same_outcome("record_batches", data, canonical, rows)
    if isinstance(canonical, list) and canonical:
        check_records(section, canonical[0][0] - header.base_offset, MAX_UNCOMPRESSED)


def decode_record_batches(data: bytes) -> None:
    """The produce check on the whole payload, then each batch through every decoder (CRCs computed, not required:
    the fuzzer cannot forge them, and decoders must survive bad bytes with a good CRC all the same)."""
    accepted = _outcome(lambda: check_produced(data, PRODUCE_LIMITS, NOW_NS), RecordFormatError)
    for pos, header in iter_batches(data, verify=False):
        crc_ok(data, pos, header)
        registers_block(data, pos, header=header)
        _records_both_ways(data, pos, header, not isinstance(accepted, str))


def _sample_batch(codec: Codec = Codec.NONE, count: int = 3) -> bytes:
    records = [
        NewRecord(f"value-{i}".encode(), key=b"k" if i % 2 else None, headers=[("h", b"v")] if i == 1 else [])
        for i in range(count)
    ]
    return build_batch(records, timestamp=1_700_000_000_000_000_000, codec=codec, base_offset=40)


def _record_batch_seeds() -> list[bytes]:
    plain, zstd, lz4 = _sample_batch(), _sample_batch(Codec.ZSTD), _sample_batch(Codec.LZ4)
    alike = build_batch([NewRecord(b"x" * 8) for _ in range(40)], timestamp=1)  # a run: the fast decoders' path
    inflated = bytearray(plain)
    inflated[8:12] = (0x7FFF_FFFF).to_bytes(4, "big")  # a batch length claiming 2 GiB
    return [plain, zstd, lz4, alike, plain + zstd, bytes(inflated), plain[:-3]]


# ------------------------------------------------------------------------------------------------- Liftbridge


def decode_liftbridge_envelope(data: bytes) -> None:
    parse_envelope(data)
    record_from_nats("orders.in", "_INBOX.r", data, [("H", b"v")], "orders.in", 1)


def _liftbridge_seeds() -> list[bytes]:
    message = api_pb2.Message(
        key=b"k", value=b"v", ackInbox="_INBOX.a", correlationId="c1", ackPolicy=api_pb2.AckPolicy.ALL
    )
    message.headers["h"] = b"x"
    payload = message.SerializeToString()
    bad_inbox = api_pb2.Message(value=b"v", ackInbox="bad inbox*", ackPolicy=api_pb2.AckPolicy.ALL).SerializeToString()
    ack = api_pb2.Ack(stream="s", offset=3).SerializeToString()
    return [
        encode_envelope(MessageType.PUBLISH, payload),
        encode_envelope(MessageType.PUBLISH, payload, with_crc=False),
        encode_envelope(MessageType.PUBLISH, bad_inbox),
        encode_envelope(MessageType.ACK, ack),
        b"plain nats message",
    ]


# ------------------------------------------------------------------------------------------------- NATS


NATS_PREFIX = b"MSG orders.in 1 "


def _nats_items(chunks: list[bytes]) -> list[object]:
    out: list[natsproto.Item] = []
    controls: list[tuple[bytes, bytes]] = []

    def on_control(op: bytes, arg: bytes) -> None:
        controls.append((op, arg))
        if op == b"INFO":
            natsproto.parse_info(arg)
        elif op == b"-ERR":
            natsproto.parse_error(arg)

    parser = natsproto.Parser(on_control, NATS_PREFIX, max_payload=MAX_FRAME_BYTES)
    for chunk in chunks:
        parser.feed(chunk, out)
    items: list[object] = []
    for item in out:
        if isinstance(item, natsproto.Msg):
            headers = None if item.headers is None else natsproto.parse_headers(item.headers)
            items.append((item.subject, item.sid, item.reply, item.payload, headers))
        else:
            items.append(bytes(item))
    return [*items, *controls]


def decode_nats_protocol(data: bytes) -> None:
    whole = _outcome(lambda: _nats_items([data]), natsproto.ProtocolError)
    pieces = _outcome(lambda: _nats_items(_pieces(data)), natsproto.ProtocolError)
    same_outcome("nats_protocol", data, whole, pieces)


def _nats_seeds() -> list[bytes]:
    info = b'INFO {"server_id":"x","max_payload":1048576,"headers":true}\r\n'
    plain = NATS_PREFIX + b"5\r\nhello\r\n"
    reply = b"MSG orders.in 1 _INBOX.r 3\r\nabc\r\n"
    hmsg = b"HMSG orders.in 1 22 25\r\nNATS/1.0\r\nA: b\r\nC:d\r\n\r\nabc\r\n"
    status = b"HMSG orders.in 1 16 16\r\nNATS/1.0 503\r\n\r\n\r\n"
    control = b"PING\r\nPONG\r\n+OK\r\n-ERR 'Authorization Violation'\r\n"
    huge = b"MSG orders.in 1 99999999999999999999\r\n"
    return [info, plain, plain * 5, reply, hmsg, status, control, info + plain + hmsg + control, huge]


# ------------------------------------------------------------------------------------------------- the registry


TARGETS: dict[str, Target] = {
    target.name: target
    for target in (
        Target("wire_frames", decode_wire_frames, ProtocolError, _wire_frame_seeds),
        Target("wire_headers", decode_wire_headers, ProtocolError, _wire_header_seeds),
        Target(
            "record_batches",
            decode_record_batches,
            RecordFormatError,
            _record_batch_seeds,
            allocation_factor=RECORD_OVERHEAD,
            expansion=MAX_UNCOMPRESSED,
        ),
        Target("liftbridge_envelope", decode_liftbridge_envelope, RefusedEnvelopeError, _liftbridge_seeds),
        Target("nats_protocol", decode_nats_protocol, natsproto.ProtocolError, _nats_seeds),
        Target("session_fetch", decode_session_fetch, ProtocolError, _session_fetch_seeds),
        CHECKPOINTS,
        SEGMENT_RECOVERY,
        STAGED_SEGMENT,
    )
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tidelog.testing.fuzz_targets", description=__doc__)
    parser.add_argument("action", choices=("write-corpus", "replay"))
    parser.add_argument("corpus", type=Path, help="the corpus root: one directory per target (fuzz/corpus)")
    parser.add_argument("--target", choices=sorted(TARGETS), action="append", help="only these (default: all)")
    args = parser.parse_args(argv)
    for name in args.target or sorted(TARGETS):
        target = TARGETS[name]
        if args.action == "write-corpus":
            print(f"{name}: {write_corpus(target, args.corpus / name)} new seeds")
        else:
            try:
                print(f"{name}: {replay(target, args.corpus / name)} inputs, contract kept")
            except ContractViolation as exc:
                print(exc)
                return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
