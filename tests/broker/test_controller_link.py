"""ControllerLink.forward: a request is sent to whoever the election names, and keeps working while this broker
becomes the controller mid-request (it was failing for its whole timeout, seen as `stream create` refused
with "this broker is becoming the controller" right after a broker started)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tidelog.broker.controller_link import ControllerLink
from tidelog.protocol.errors import UnavailableError
from tidelog.protocol.messages import DeleteStreamRequest, Header


class _Election:
    def __init__(self, controller_id: str | None, *, is_controller: bool) -> None:
        self.controller_id = controller_id
        self.is_controller = is_controller


class _Controller:
    def __init__(self) -> None:
        self.active = False


class _Answer:
    def __init__(self, header: Header) -> None:
        self.header = header


class _Peers:
    """Records where each request went and answers it with the request itself."""

    def __init__(self) -> None:
        self.sent_to: list[str] = []

    async def request(self, broker_id: str, header: Header, payload: Any = b"", *, timeout: float) -> _Answer:
        self.sent_to.append(broker_id)
        return _Answer(header)


def _link(election: _Election, controller: _Controller, peers: _Peers) -> ControllerLink:
    return ControllerLink("b1", election, controller, peers)  # type: ignore[arg-type]


async def test_a_request_waiting_while_this_broker_becomes_the_controller_is_served_here() -> None:
    election, controller, peers = _Election("b1", is_controller=True), _Controller(), _Peers()
    link = _link(election, controller, peers)
    request = DeleteStreamRequest("orders", forwarded=True)

    async def take_over() -> None:
        await asyncio.sleep(0.2)  # the controller's duties start a moment after the election is won
        controller.active = True

    task = asyncio.create_task(take_over())
    answer = await asyncio.wait_for(link.forward(request, timeout=3.0), 2.5)
    await task
    assert answer == request
    assert peers.sent_to == ["b1"]  # to this broker itself, where the forwarded request meets the controller


async def test_a_request_goes_to_the_elected_controller() -> None:
    peers = _Peers()
    link = _link(_Election("b2", is_controller=False), _Controller(), peers)
    await link.forward(DeleteStreamRequest("orders", forwarded=True), timeout=1.0)
    assert peers.sent_to == ["b2"]


async def test_the_controller_key_of_an_earlier_run_is_named_when_it_blocks_a_request() -> None:
    link = _link(_Election("b1", is_controller=False), _Controller(), _Peers())
    with pytest.raises(UnavailableError, match="earlier lease"):
        await link.forward(DeleteStreamRequest("orders", forwarded=True), timeout=0.3)
