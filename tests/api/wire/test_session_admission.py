"""A session's admission control under pipelining, in-process: one socket read of many more frames than the
connection may have in flight admits no more than its limit, the rest wait (in order) until replies leave, and
no turn of the loop starts more handlers than the server's turn budget allows."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from tests.helpers import BOUND
from tidelog.api.wire.admission import TurnBudget
from tidelog.api.wire.handlers import HandlerEnv, Reply, Route, route
from tidelog.api.wire.session import Session
from tidelog.protocol.frames import FrameDecoder, Kind, Op, encode_frame
from tidelog.protocol.message_codec import encode_message
from tidelog.protocol.messages import MetadataRequest


@dataclass
class Probe:
    """A handler that counts how many of its requests run at once, and in which turn of the loop each began."""

    turn: int = 0
    ticking: bool = True
    running: int = 0
    most_running: int = 0
    started_in_turn: Counter[int] = field(default_factory=Counter)

    def tick(self) -> None:
        """Count turns of the loop: one call per turn, each scheduling the next."""
        if self.ticking:
            self.turn += 1
            asyncio.get_running_loop().call_soon(self.tick)

    async def handle(self, _env: HandlerEnv, cid: int, _header: MetadataRequest, _payload: memoryview) -> Reply:
        self.started_in_turn[self.turn] += 1
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            for _ in range(3):  # a few turns of the loop, as a handler awaiting the mirror or a log would
                await asyncio.sleep(0)
        finally:
            self.running -= 1
        return Reply(encode_frame(Kind.RESPONSE, Op.METADATA, cid, b""))


@contextlib.asynccontextmanager
async def session_over_socketpair(
    probe: Probe, *, max_in_flight: int, budget: TurnBudget
) -> AsyncIterator[tuple[Session, asyncio.StreamReader]]:
    """A session serving ``probe`` on one end of a socket pair; the other end's reader sees its replies."""
    ours, theirs = socket.socketpair()
    _, writer = await asyncio.open_connection(sock=ours)
    reader, peer_writer = await asyncio.open_connection(sock=theirs)
    routes: dict[int, Route] = {Op.METADATA: route(MetadataRequest, probe.handle)}
    session = Session(
        None,  # type: ignore[arg-type]  # the probe's handler needs no broker
        routes,
        writer,
        zero_copy=False,
        background=set(),
        max_frame_bytes=1 << 20,
        max_in_flight=max_in_flight,
        max_in_flight_bytes=1 << 30,
        budget=budget,
    )
    serving = asyncio.create_task(session.serve())
    try:
        yield session, reader
    finally:
        session.abort()
        peer_writer.close()
        await asyncio.wait({serving}, timeout=BOUND)


def pipelined(count: int) -> bytes:
    return b"".join(b"".join(encode_message(cid, MetadataRequest())) for cid in range(1, count + 1))


async def replies(reader: asyncio.StreamReader, count: int, on_reply: Callable[[], Any] = lambda: None) -> list[int]:
    decoder = FrameDecoder()
    cids: list[int] = []
    async with asyncio.timeout(BOUND):
        while len(cids) < count:
            data = await reader.read(1 << 16)
            assert data, "the session closed the connection"
            for frame in decoder.feed(data):
                assert frame.kind is Kind.RESPONSE
                cids.append(frame.correlation_id)
                on_reply()
    return cids


async def test_one_read_of_many_pipelined_frames_admits_no_more_than_max_in_flight() -> None:
    probe = Probe()
    async with session_over_socketpair(probe, max_in_flight=8, budget=TurnBudget()) as (session, reader):
        session.feed(pipelined(2000))  # one read, 250 times the connection's limit
        cids = await replies(reader, 2000)
    assert cids == list(range(1, 2001))  # every request answered, in order
    assert probe.most_running <= 8


async def test_no_turn_of_the_loop_starts_more_handlers_than_the_turn_budget() -> None:
    probe = Probe()
    probe.tick()
    async with session_over_socketpair(probe, max_in_flight=4096, budget=TurnBudget(requests=16)) as (session, reader):
        session.feed(pipelined(2000))
        cids = await replies(reader, 2000)
    probe.ticking = False
    assert cids == list(range(1, 2001))
    assert max(probe.started_in_turn.values()) <= 16


async def test_a_request_on_another_connection_does_not_wait_for_a_flood_to_be_admitted() -> None:
    flooded, other = Probe(), Probe()
    budget = TurnBudget(requests=16)  # shared, as by all the connections of one server
    async with (
        session_over_socketpair(flooded, max_in_flight=4096, budget=budget) as (flood, flood_reader),
        session_over_socketpair(other, max_in_flight=4096, budget=budget) as (single, single_reader),
    ):
        flood.feed(pipelined(2000))
        single.feed(pipelined(1))
        (cid,) = await replies(single_reader, 1)
        started_before_it = flooded.started_in_turn.total()
        assert await replies(flood_reader, 2000) == list(range(1, 2001))
    assert cid == 1
    assert started_before_it < 2000  # its turn came while the flood was still being admitted
