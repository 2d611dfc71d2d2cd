"""Ingest's record encoder: exactly the bytes ``build_batch`` makes for the same records, within the batch limits."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.broker.ingest.encoder import Decoded, Encoded, IngestEncoder, Message, plain_record_size
from tidelog.broker.ingest.natsproto import Msg
from tidelog.protocol._gen import api_pb2
from tidelog.protocol.envelope import MessageType, encode_envelope
from tidelog.protocol.liftbridge import record_from_nats
from tidelog.protocol.records import HEADER_SIZE, NewRecord, build_batch, decode_records, iter_batches

SUBJECT = "orders.in"
T0 = 1_700_000_000_123_456_789
BIG = 64 * 1024 * 1024


def envelope(**fields: Any) -> bytes:
    return encode_envelope(MessageType.PUBLISH, api_pb2.Message(**fields).SerializeToString())


def expected_record(message: Message, timestamp: int) -> NewRecord:
    """What the general path (``record_from_nats``) makes of ``message``."""
    if isinstance(message, memoryview):
        return record_from_nats(SUBJECT, "", bytes(message), (), SUBJECT, timestamp)[0]
    if isinstance(message, Msg):
        headers = [] if message.headers is None else [("H", b"v")]  # the blocks below carry exactly this header
        subject, reply = message.subject.decode(), message.reply.decode()
        return record_from_nats(subject, reply, message.payload, headers, SUBJECT, timestamp)[0]
    return record_from_nats(message.subject, message.reply, message.payload, message.headers, SUBJECT, timestamp)[0]


_VALUE = st.one_of(
    st.binary(max_size=40),
    st.binary(min_size=8000, max_size=9000),  # lengths past the one-byte and table ranges of the varints
    st.just(b"\xb9"),
    st.builds(lambda v: envelope(value=v, key=b"k", headers={"a": b"1"}), st.binary(max_size=20)),
    st.builds(lambda v: envelope(value=v, ackInbox="acks", correlationId="c", ackPolicy=api_pb2.ALL), st.binary()),
)
_PLAIN = st.builds(memoryview, _VALUE)  # as the parser hands them over
_MESSAGE: st.SearchStrategy[Message] = st.one_of(
    _PLAIN,
    _PLAIN,
    st.builds(lambda v, r: Msg(SUBJECT.encode(), b"1", r, v, None), _VALUE, st.sampled_from([b"", b"reply.x"])),
    st.builds(lambda v: Msg(b"orders.other", b"1", b"", v, b"NATS/1.0\r\nH: v\r\n\r\n"), _VALUE),
    st.builds(
        lambda v, h: Decoded(SUBJECT, "", v, h),
        _VALUE,
        st.lists(st.tuples(st.sampled_from(["X", "_tl.subject", "é"]), st.binary(max_size=5)), max_size=3),
    ),
)


def batches_of(encoded: Encoded) -> list[bytes]:
    """The read's buffer cut into its batches (each CRC-checked)."""
    return [bytes(encoded.data[pos : pos + header.size]) for pos, header in iter_batches(encoded.data)]


@settings(max_examples=300, deadline=None)
@given(st.lists(_MESSAGE, min_size=1, max_size=40), st.integers(min_value=0, max_value=2**62))
def test_one_batch_is_exactly_what_build_batch_makes(messages: list[Message], first: int) -> None:
    encoded = IngestEncoder(SUBJECT, max_batch_bytes=BIG, max_batch_records=1000).encode(messages, first)
    records = [expected_record(m, first + k) for k, m in enumerate(messages)]
    assert bytes(encoded.data) == build_batch(records, timestamp=first)
    assert (encoded.counts, encoded.records, encoded.too_large) == ([len(messages)], len(messages), [])


def test_plain_records_beyond_the_tables() -> None:
    """Offset deltas past the precomputed table and values past the length table."""
    values = [b"v%d" % i for i in range(5000)] + [b"x" * 20000]
    encoded = IngestEncoder(SUBJECT, max_batch_bytes=BIG, max_batch_records=10_000).encode(map(memoryview, values), T0)
    expected = build_batch([NewRecord(v, timestamp=T0 + k) for k, v in enumerate(values)], timestamp=T0)
    assert bytes(encoded.data) == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(_MESSAGE, min_size=1, max_size=60),
    st.integers(min_value=HEADER_SIZE + 40, max_value=20_000),
    st.integers(min_value=1, max_value=7),
    st.integers(min_value=0, max_value=2**62),
)
def test_batches_are_exactly_build_batch_within_the_limits(
    messages: list[Message], max_bytes: int, max_records: int, first: int
) -> None:
    encoded = IngestEncoder(SUBJECT, max_batch_bytes=max_bytes, max_batch_records=max_records).encode(messages, first)
    kept = [
        record
        for record in (expected_record(m, 0) for m in messages)
        if len(build_batch([record], timestamp=0)) <= max_bytes
    ]
    assert encoded.records == len(kept) and len(encoded.too_large) == len(messages) - len(kept)
    # Re-encode what each batch holds with build_batch (stamped first + j for the j-th stored record): same bytes.
    j = 0
    for batch, count in zip(batches_of(encoded), encoded.counts, strict=True):
        assert len(batch) <= max_bytes and 1 <= count <= max_records
        records = [NewRecord(r.value, r.key, r.headers, first + j + i) for i, r in enumerate(kept[j : j + count])]
        assert batch == build_batch(records, timestamp=first + j)
        j += count
    assert j == len(kept)


def test_a_message_too_large_for_any_batch_is_reported_not_stored() -> None:
    limit = HEADER_SIZE + 100
    fits = b"x" * max(n for n in range(100) if plain_record_size(0, n) <= 100)
    assert len(build_batch([NewRecord(fits)], timestamp=0)) == limit
    encoded = IngestEncoder(SUBJECT, max_batch_bytes=limit, max_batch_records=10).encode(
        map(memoryview, [b"a", fits, fits + b"y", b"b"]), T0
    )
    assert encoded.counts == [1, 1, 1]
    assert [bytes(r.value or b"") for b in batches_of(encoded) for r in decode_records(b)] == [b"a", fits, b"b"]
    assert encoded.too_large == [len(fits) + 1]


def test_nothing_to_store_is_an_empty_buffer() -> None:
    encoded = IngestEncoder(SUBJECT, max_batch_bytes=HEADER_SIZE + 10, max_batch_records=10).encode(
        [memoryview(b"y" * 100)], T0
    )
    assert (bytes(encoded.data), encoded.counts, encoded.too_large) == (b"", [], [100])


def test_acks_name_their_record_in_the_read() -> None:
    ack_me = memoryview(envelope(value=b"v", ackInbox="acks", correlationId="c1", ackPolicy=api_pb2.LEADER))
    quiet = memoryview(envelope(value=b"v", ackInbox="acks", correlationId="c2", ackPolicy=api_pb2.NONE))
    encoded = IngestEncoder(SUBJECT, max_batch_bytes=BIG, max_batch_records=2).encode(
        [memoryview(b"plain"), ack_me, quiet, ack_me], T0
    )
    assert encoded.counts == [2, 2]
    assert [(i, a.correlation_id) for i, a in encoded.acks] == [(1, "c1"), (3, "c1")]


@pytest.mark.parametrize(("max_bytes", "max_records"), [(HEADER_SIZE, 1), (1000, 0)])
def test_limits_are_checked(max_bytes: int, max_records: int) -> None:
    with pytest.raises(ValueError):
        IngestEncoder(SUBJECT, max_batch_bytes=max_bytes, max_batch_records=max_records)


def test_a_message_that_cannot_be_taken_is_refused_alone() -> None:
    """A refused envelope, or a message that fails to encode for any reason, costs none of its neighbours."""
    bad_policy = envelope(value=b"v", ackInbox="acks", correlationId="c1", ackPolicy=300)
    bad_inbox = envelope(value=b"v", ackInbox="a b", correlationId="c2")
    unencodable = Decoded(SUBJECT, "", b"v", [("lone \udc80 surrogate", b"x")])  # a header name UTF-8 cannot hold
    messages: list[Message] = [memoryview(b"a"), memoryview(bad_policy), memoryview(b"b")]
    messages += [memoryview(bad_inbox), unencodable, memoryview(b"c")]
    encoded = IngestEncoder(SUBJECT, max_batch_bytes=BIG, max_batch_records=100).encode(messages, T0)

    expected = [NewRecord(v, timestamp=T0 + k) for k, v in enumerate([b"a", b"b", b"c"])]
    assert bytes(encoded.data) == build_batch(expected, timestamp=T0)
    policy, inbox, other = encoded.refused
    assert "ackPolicy" in policy.reason and "300" in policy.reason and policy.subject == SUBJECT
    assert policy.ack is not None and (policy.ack.ack_inbox, policy.ack.correlation_id) == ("acks", "c1")
    assert "ackInbox" in inbox.reason and inbox.ack is None  # nowhere to answer
    assert "UnicodeEncodeError" in other.reason and other.ack is None
