"""The client's frame headers as values: their numbering, defaults and immutability (the codec's tests are in
``test_message_codec.py``)."""

from __future__ import annotations

import pytest

from tidelog.protocol.messages import Acks, FetchRequest, Isolation, ProduceRequest


def test_acks_are_numbered_as_liftbridge_ack_policy() -> None:
    assert (Acks.LEADER, Acks.ALL, Acks.NONE) == (0, 1, 2)


def test_defaults() -> None:
    request = FetchRequest("s", 0, 10)
    assert (request.max_bytes, request.max_wait_ms, request.min_bytes, request.isolation) == (
        1024 * 1024,
        500,
        1,
        Isolation.COMMITTED,
    )
    assert ProduceRequest("s", 0).acks is Acks.ALL


def test_headers_are_frozen_and_hashable_when_their_fields_are() -> None:
    request = ProduceRequest("s", 1)
    with pytest.raises(AttributeError):
        request.partition = 2  # type: ignore[misc]
    assert hash(request) == hash(ProduceRequest("s", 1))
