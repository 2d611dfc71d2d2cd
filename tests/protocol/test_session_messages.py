"""SESSION_FETCH's headers on the wire, and splitting its payload into each partition's batches."""

from __future__ import annotations

import pytest

from tidelog.protocol.frames import FrameDecoder, Kind, Op, ProtocolError
from tidelog.protocol.message_codec import decode_frame_header, encode_message
from tidelog.protocol.messages import ErrorBody
from tidelog.protocol.session_messages import (
    SessionFetchEntry,
    SessionFetchPartition,
    SessionFetchRequest,
    SessionFetchResponse,
    rotated,
    split_payload,
)


def _round_trip(header: object, payload: bytes = b"") -> tuple[object, bytes]:
    frames = FrameDecoder().feed(b"".join(bytes(b) for b in encode_message(7, header, payload)))  # type: ignore[arg-type]
    assert len(frames) == 1 and frames[0].op == Op.SESSION_FETCH and frames[0].correlation_id == 7
    return decode_frame_header(frames[0]), bytes(frames[0].payload)


def test_a_request_and_a_response_cross_the_wire_unchanged() -> None:
    request = SessionFetchRequest(
        "b", (SessionFetchEntry("s", 0, 5, 2, 4), SessionFetchEntry("t", 3, 0, 1, 0, True)), 1000, 100, 250
    )
    decoded, _ = _round_trip(request)
    assert decoded == request
    parts = (
        SessionFetchPartition("s", 0, 5, 0, 7, 2, 3),
        SessionFetchPartition("t", 3, 0, 0, 0, 1, 0, ErrorBody(5, "fenced", True)),
    )
    response, payload = _round_trip(SessionFetchResponse(parts), b"abc")
    assert response == SessionFetchResponse(parts) and payload == b"abc"
    frames = FrameDecoder().feed(b"".join(bytes(b) for b in encode_message(1, request)))  # type: ignore[arg-type]
    assert frames[0].kind is Kind.REQUEST


def test_the_payload_splits_into_each_partitions_batches_in_order() -> None:
    parts = (SessionFetchPartition("s", 0, 0, 0, 9, 0, 2), SessionFetchPartition("s", 1, 0, 0, 0, 0, 0),
             SessionFetchPartition("s", 2, 0, 0, 9, 0, 3))  # fmt: skip
    split = split_payload(SessionFetchResponse(parts), memoryview(b"aabbb"))
    assert [(p.partition, bytes(d)) for p, d in split] == [(0, b"aa"), (1, b""), (2, b"bbb")]


@pytest.mark.parametrize(("sizes", "payload"), [((2, 4), b"aabbb"), ((2,), b"aabbb")], ids=["short", "left-over"])
def test_sizes_that_do_not_add_up_to_the_payload_are_a_protocol_error(sizes: tuple[int, ...], payload: bytes) -> None:
    parts = tuple(SessionFetchPartition("s", i, 0, 0, 9, 0, size) for i, size in enumerate(sizes))
    with pytest.raises(ProtocolError, match="session fetch"):
        split_payload(SessionFetchResponse(parts), memoryview(payload))


def test_rotation_starts_each_round_one_entry_later() -> None:
    entries = tuple(SessionFetchEntry("s", i, 0, 0) for i in range(3))
    assert [e.partition for e in rotated(entries, 0)] == [0, 1, 2]
    assert [e.partition for e in rotated(entries, 1)] == [1, 2, 0]
    assert [e.partition for e in rotated(entries, 5)] == [2, 0, 1]
    assert rotated((), 3) == ()
