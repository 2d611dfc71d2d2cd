"""The fetcher's link to its leader: addresses, and what a response of the wrong type means."""

from __future__ import annotations

import pytest

from tidelog.protocol.connection import ConnectionClosedError
from tidelog.protocol.frames import ProtocolError
from tidelog.protocol.peer_messages import EpochEndOffsetResponse, ReplicaFetchResponse
from tidelog.replication.follower.leader_link import LeaderLink, expect, split_address


def test_addresses_split_into_host_and_port() -> None:
    assert split_address("127.0.0.1:9292") == ("127.0.0.1", 9292)
    assert split_address("[::1]:9292") == ("::1", 9292)
    with pytest.raises(ValueError):
        split_address("nohost")


def test_a_response_of_another_type_is_a_protocol_error() -> None:
    answer = EpochEndOffsetResponse(3, 10)
    assert expect(answer, EpochEndOffsetResponse) is answer
    with pytest.raises(ProtocolError, match="expected a ReplicaFetchResponse"):
        expect(answer, ReplicaFetchResponse)


def test_a_link_never_opened_is_not_connected_and_refuses_requests() -> None:
    link = LeaderLink("b", "127.0.0.1:9292", connect_timeout=1.0)
    assert not link.connected
    with pytest.raises(ConnectionClosedError, match="not connected to leader b"):
        link.request(EpochEndOffsetResponse(3, 10))
