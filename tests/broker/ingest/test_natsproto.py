"""The ingest reader's NATS protocol codec: exact command bytes, and a parser that gives the same result however
the server's stream is cut into reads."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.broker.ingest.natsproto import (
    MAX_CONTROL_LINE,
    Msg,
    Parser,
    ProtocolError,
    Route,
    connect_command,
    parse,
    parse_error,
    parse_headers,
    parse_info,
    plain_prefix,
    sub_command,
    unsub_command,
)

SUBJECT = "orders.in"
SID = "1"
PREFIX = plain_prefix(SUBJECT, SID)

# ---------------------------------------------------------------------------------------------- encoding


def test_commands() -> None:
    assert sub_command("a.b", "1") == b"SUB a.b 1\r\n"
    assert sub_command("a.*", "7", "workers") == b"SUB a.* workers 7\r\n"
    assert unsub_command("7") == b"UNSUB 7\r\n"
    command = connect_command({"verbose": False, "name": "x"})
    assert command.startswith(b"CONNECT {") and command.endswith(b"}\r\n")
    assert json.loads(command[len(b"CONNECT ") :]) == {"verbose": False, "name": "x"}


@pytest.mark.parametrize("bad", ["", "a b", "a\tb", "a\r\nb"])
def test_subjects_with_whitespace_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        sub_command(bad, "1")


def test_plain_prefix_only_for_literal_subjects() -> None:
    assert plain_prefix("a.b", "1") == b"MSG a.b 1 "
    assert plain_prefix("a.*", "1") is None
    assert plain_prefix("a.>", "1") is None
    assert plain_prefix("a*.b", "1") == b"MSG a*.b 1 "  # not a wildcard token: a literal subject


def test_errors_and_info() -> None:
    assert parse_error(b"'Authorization Violation'") == "Authorization Violation"
    assert parse_info(b'{"max_payload": 1024}') == {"max_payload": 1024}
    with pytest.raises(ProtocolError):
        parse_info(b"not json")
    with pytest.raises(ProtocolError):
        parse_info(b"[1]")


def test_headers() -> None:
    block = b"NATS/1.0\r\nX-Trace: abc\r\nX-Trace:  def \r\nbad line\r\nsp ace: x\r\nEmpty:\r\n\r\n"
    assert parse_headers(block) == [("X-Trace", b"abc"), ("X-Trace", b"def"), ("Empty", b"")]
    assert parse_headers(b"NATS/1.0 503\r\n\r\n") == [("Status", b"503")]
    assert parse_headers(b"NATS/1.0 404 No Messages\r\nK: v\r\n\r\n") == [
        ("Status", b"404"),
        ("Description", b"No Messages"),
        ("K", b"v"),
    ]
    assert parse_headers(b"NATS/1.0\r\nK: \xff\xfe\r\n\r\n") == [("K", b"\xff\xfe")]  # value bytes kept as sent


# ---------------------------------------------------------------------------------------------- a server's stream

_TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=8)
_PAYLOAD = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"", b"\r\n", b"MSG orders.in 1 3\r\nabc\r\n", b"\r\nMSG orders.in 1 ", b"PING\r\n", b"12"]),
    st.binary(min_size=200, max_size=3000),
)


@st.composite
def header_blocks(draw: st.DrawFn) -> tuple[bytes, list[tuple[str, bytes]]]:
    pairs = draw(st.lists(st.tuples(_TOKEN, st.binary(max_size=12).filter(_plain_value)), max_size=4))
    block = b"NATS/1.0\r\n" + b"".join(f"{k}: ".encode() + v + b"\r\n" for k, v in pairs) + b"\r\n"
    return block, [(k, v.strip()) for k, v in pairs]


def _plain_value(value: bytes) -> bool:
    return b"\r" not in value and b"\n" not in value


@st.composite
def operations(draw: st.DrawFn) -> tuple[bytes, list[Any]]:
    """One server operation: its bytes and what a parser with :data:`PREFIX` must report for it."""
    kind = draw(st.sampled_from(["plain", "plain", "plain", "reply", "other", "hmsg", "control", "info", "err"]))
    if kind == "plain":
        payload = draw(_PAYLOAD)
        return b"MSG orders.in 1 %d\r\n" % len(payload) + payload + b"\r\n", [payload]
    if kind in ("reply", "other"):
        payload = draw(_PAYLOAD)
        subject = SUBJECT if kind == "reply" else f"orders.{draw(_TOKEN)}x"
        reply = draw(_TOKEN).encode() if kind == "reply" else b""
        line = b" ".join([b"MSG", subject.encode(), SID.encode(), *([reply] if reply else []), b"%d" % len(payload)])
        return line + b"\r\n" + payload + b"\r\n", [Msg(subject.encode(), b"1", reply, payload, None)]
    if kind == "hmsg":
        payload = draw(_PAYLOAD)
        block, _ = draw(header_blocks())
        reply = draw(st.sampled_from([b"", b"inbox.1"]))
        fields = [b"HMSG", SUBJECT.encode(), SID.encode(), *([reply] if reply else [])]
        line = b" ".join([*fields, b"%d" % len(block), b"%d" % (len(block) + len(payload))])
        return line + b"\r\n" + block + payload + b"\r\n", [Msg(SUBJECT.encode(), b"1", reply, payload, block)]
    if kind == "control":
        op = draw(st.sampled_from([b"PING", b"PONG", b"+OK"]))
        return op + b"\r\n", [("control", op, b"")]
    if kind == "info":
        text = json.dumps({"server_id": draw(_TOKEN), "max_payload": 1048576, "connect_urls": ["a:1"]}).encode()
        return b"INFO " + text + b"\r\n", [("control", b"INFO", text)]
    text = b"'" + draw(_TOKEN).encode() + b" Violation'"
    return b"-ERR " + text + b"\r\n", [("control", b"-ERR", text)]


def feed_in_pieces(stream: bytes, cuts: list[int], prefix: bytes | None = PREFIX) -> list[Any]:
    """Feed ``stream`` to a parser cut at ``cuts``; control operations land in the same list, in stream order.

    Plain payloads come as views of the reads: they are turned into ``bytes`` here, after every read was fed, so
    a view that outlived its read's bytes (or saw them change) would show.
    """
    out: list[Any] = []
    parser = Parser(lambda op, arg: out.append(("control", op, arg)), prefix)
    points = [0, *sorted(set(cuts)), len(stream)]
    for begin, end in itertools.pairwise(points):
        parser.feed(stream[begin:end], out)
    assert parser.buffered == 0
    assert all(isinstance(item, (memoryview, Msg, tuple)) for item in out)
    return [bytes(item) if isinstance(item, memoryview) else item for item in out]


@settings(max_examples=300)
@given(st.lists(operations(), max_size=25), st.lists(st.integers(min_value=0), max_size=12))
def test_any_split_of_a_stream_parses_the_same(ops: list[tuple[bytes, list[Any]]], cuts: list[int]) -> None:
    stream = b"".join(data for data, _ in ops)
    expected = [item for _, items in ops for item in items]
    assert feed_in_pieces(stream, [c % (len(stream) + 1) for c in cuts]) == expected


@given(st.lists(operations(), max_size=15), st.lists(st.integers(min_value=0), max_size=6))
def test_without_a_prefix_every_message_is_a_msg(ops: list[tuple[bytes, list[Any]]], cuts: list[int]) -> None:
    stream = b"".join(data for data, _ in ops)
    expected = [
        Msg(SUBJECT.encode(), b"1", b"", item, None) if isinstance(item, bytes) else item  # plain, with a prefix
        for _, items in ops
        for item in items
    ]
    assert feed_in_pieces(stream, [c % (len(stream) + 1) for c in cuts], prefix=None) == expected


def test_one_byte_at_a_time() -> None:
    stream = b"MSG orders.in 1 5\r\nhello\r\nPING\r\nMSG orders.in 1 r 2\r\nhi\r\nMSG orders.in 1 0\r\n\r\n"
    assert feed_in_pieces(stream, list(range(len(stream)))) == [
        b"hello",
        ("control", b"PING", b""),
        Msg(b"orders.in", b"1", b"r", b"hi", None),
        b"",
    ]


def test_a_large_payload_is_gathered_and_joined_once() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    stream = b"MSG orders.in 1 %d\r\n" % len(payload) + payload + b"\r\nPING\r\n"
    out: list[Any] = []
    parser = Parser(lambda op, arg: out.append(op), PREFIX)
    parser.feed(stream[:100], out)
    for begin in range(100, len(stream), 65536):
        assert out == []
        parser.feed(stream[begin : begin + 65536], out)
    assert out == [payload, b"PING"]
    assert parser.buffered == 0


def test_parse_reports_what_it_needs() -> None:
    out: list[Any] = []
    stream = b"MSG orders.in 1 10\r\nabc"
    assert parse(stream, 0, out, lambda op, arg: None, PREFIX) == (0, len(stream) - 3 + 10 + 2)
    assert parse(b"MSG orders.in 1 1", 0, out, lambda op, arg: None, PREFIX) == (0, 0)
    assert out == []


@pytest.mark.parametrize(
    "stream",
    [
        b"MSG orders.in 1 3\r\nabcX\r\n",  # payload longer than its count
        b"HMSG orders.in 1 3\r\nabc\r\n",  # too few fields
        b"HMSG orders.in 1 9 3\r\nabc\r\n",  # header longer than the message
        b"MSG orders.in 1 -3\r\nabc\r\n",
        b"MSG orders.in 1 x y z\r\n",
        b"BOGUS\r\n",
        b"\r\n",
        b"MSG orders.x 1 3\r\nabcde",  # general path, bad trailer
        b"MSG orders.in 1 " + b"9" * 5000 + b"\r\n",  # past what int() converts
    ],
)
def test_garbage_is_a_protocol_error(stream: bytes) -> None:
    with pytest.raises(ProtocolError):
        Parser(lambda op, arg: None, PREFIX).feed(stream, [])


def test_messages_before_a_fault_are_kept() -> None:
    out: list[Any] = []
    with pytest.raises(ProtocolError):
        Parser(lambda op, arg: None, PREFIX).feed(b"MSG orders.in 1 2\r\nok\r\nMSG orders.in 1 2\r\nbad!\r\n", out)
    assert out == [b"ok"]


def test_a_line_without_end_is_refused_past_the_limit() -> None:
    parser = Parser(lambda op, arg: None, PREFIX)
    parser.feed(b"INFO " + b"x" * (MAX_CONTROL_LINE // 2), [])
    with pytest.raises(ProtocolError):
        parser.feed(b"x" * MAX_CONTROL_LINE, [])


def test_a_payload_above_max_payload_is_refused_before_it_is_buffered() -> None:
    parser = Parser(lambda op, arg: None, PREFIX, max_payload=1000)
    with pytest.raises(ProtocolError):
        parser.feed(b"MSG orders.in 1 5000\r\nabc", [])
    with pytest.raises(ProtocolError):
        Parser(lambda op, arg: None, PREFIX, max_payload=1000).feed(b"MSG orders.in 1 r 5000\r\nabc", [])


def test_routes_sort_interleaved_subscriptions_whatever_the_split() -> None:
    """A connection carrying three subscriptions (one a wildcard): each message reaches its sid's route, plain ones
    as views, in order, however the stream is cut; a sid with no route goes to ``out``."""
    stream = (
        b"MSG a.in 1 2\r\na1\r\nMSG a.in 1 2\r\na2\r\nMSG b.in 2 2\r\nb1\r\nPING\r\nMSG a.in 1 r 2\r\na3\r\n"
        b"MSG w.x 3 2\r\nw1\r\nMSG b.in 2 2\r\nb2\r\nMSG gone 9 1\r\ng\r\nMSG a.in 1 2\r\na4\r\n"
        b"HMSG b.in 2 12 14\r\nNATS/1.0\r\n\r\nb3\r\n"
    )
    expected = {
        b"1": [b"a1", b"a2", Msg(b"a.in", b"1", b"r", b"a3", None), b"a4"],
        b"2": [b"b1", b"b2", Msg(b"b.in", b"2", b"", b"b3", b"NATS/1.0\r\n\r\n")],
        b"3": [Msg(b"w.x", b"3", b"", b"w1", None)],
    }
    for cut in range(len(stream) + 1):
        routes = {
            b"1": Route(plain_prefix("a.in", "1")),
            b"2": Route(plain_prefix("b.in", "2")),
            b"3": Route(plain_prefix("w.*", "3")),
        }
        controls: list[bytes] = []
        parser = Parser(lambda op, _arg, seen=controls: seen.append(op), routes=routes)
        unrouted: list[Any] = []
        for piece in (stream[:cut], stream[cut:]):
            parser.feed(piece, unrouted)
        got = {sid: [bytes(i) if isinstance(i, memoryview) else i for i in r.items] for sid, r in routes.items()}
        assert got == expected, cut
        assert unrouted == [Msg(b"gone", b"9", b"", b"g", None)] and controls == [b"PING"]
        assert {id(r) for r in parser.touched} == {id(r) for r in routes.values()}
