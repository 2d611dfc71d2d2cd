"""Resource bounds under abuse, on the wire server in-process over one real partition (issue 23, item 6).

A client that opens many connections from one address, one that pipelines fetches and never reads a reply, and
idle connections: each is bounded by a setting, refused or closed with a reason, and another client is served
meanwhile. Abusers connect from other loopback addresses (127.0.0.2, ...: all of 127/8 is local on Linux) so
that the per-address limit has someone else to protect.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tests.api.wire.test_server_unit import Peer, batch, serving
from tests.helpers import BOUND
from tidelog.api.wire.connection_limits import ConnectionLimits, ensure_descriptors
from tidelog.broker.config_values import ConfigError
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.frames import Kind
from tidelog.protocol.messages import Acks, ErrorBody, FetchRequest, ProduceRequest, ProduceResponse


async def connect_from(port: int, address: str) -> Peer:
    sock = socket.socket()
    sock.bind((address, 0))
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await Peer.connect(port, sock)


async def until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not check():
        assert time.monotonic() < deadline, f"not within {BOUND} s: {what}"
        await asyncio.sleep(0.01)


async def refused(peer: Peer) -> str:
    """The one error frame a refused connection gets (correlation id 0, UNAVAILABLE), then its close."""
    kind, cid, header, _ = await peer.next()
    assert (kind, cid) == (Kind.ERROR, 0)
    assert isinstance(header, ErrorBody) and header.code == ErrorCode.UNAVAILABLE
    assert await peer.closed()
    return header.message


async def produce_answered(peer: Peer, cid: int) -> None:
    peer.send(cid, ProduceRequest("s", 0, Acks.LEADER), batch(b"served %d" % cid))
    kind, got, header, _ = await peer.next()
    assert (kind, got) == (Kind.RESPONSE, cid)
    assert isinstance(header, ProduceResponse)


@contextlib.asynccontextmanager
async def crowd(port: int, address: str, count: int) -> AsyncIterator[list[Peer]]:
    peers: list[Peer] = []
    try:
        for _ in range(count):
            peers.append(await connect_from(port, address))
        yield peers
    finally:
        for peer in peers:
            peer.close()


async def test_connections_over_the_limits_are_refused_and_the_other_clients_are_served(tmp_path: Path) -> None:
    async with serving(tmp_path, max_connections=300, max_connections_per_ip=200) as served:
        limits = served.server.limits
        client = await Peer.connect(served.port)  # from 127.0.0.1, before the flood
        await produce_answered(client, 1)
        async with crowd(served.port, "127.0.0.2", 200):
            await until(lambda: limits.open == 201, "201 connections counted")
            # One more from the flooding address is refused, with a reason naming the setting (also when the
            # client sends a request before it reads)...
            message = await refused(await connect_from(served.port, "127.0.0.2"))
            assert "wire_max_connections_per_ip" in message and "127.0.0.2" in message
            eager = await connect_from(served.port, "127.0.0.2")
            eager.send(9, ProduceRequest("s", 0, Acks.LEADER), batch(b"never read"))
            assert message == await refused(eager)
            # ...while the client already connected, and a new one from elsewhere, are served.
            await produce_answered(client, 2)
            other = await connect_from(served.port, "127.0.0.3")
            await produce_answered(other, 3)
            async with crowd(served.port, "127.0.0.4", 98):
                await until(lambda: limits.open == 300, "300 connections counted")
                message = await refused(await connect_from(served.port, "127.0.0.5"))
                assert "wire_max_connections" in message and "at most 300" in message
                await produce_answered(client, 4)
        # The flood gone, its address is served again.
        await until(lambda: limits.open == 2, "the closed connections released")
        await produce_answered(await connect_from(served.port, "127.0.0.2"), 5)
        other.close()
        client.close()


async def test_an_idle_connection_is_closed_but_not_one_waiting_on_a_long_poll(tmp_path: Path) -> None:
    async with serving(tmp_path, idle_timeout=0.3) as served:
        idle = await Peer.connect(served.port)
        polling = await Peer.connect(served.port)
        started = time.monotonic()
        polling.send(1, FetchRequest("s", 0, 0, max_wait_ms=1500))  # in flight much longer than the timeout
        assert await idle.closed()
        kind, cid, _, payload = await polling.next()
        assert (kind, cid, payload) == (Kind.RESPONSE, 1, b"")
        assert time.monotonic() - started >= 1.4  # the long-poll ran out its wait: it was not wound down
        assert await polling.closed()  # idle from its reply on


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_client_pipelining_fetches_it_never_reads_holds_at_most_its_in_flight_limit(tmp_path: Path) -> None:
    async with serving(tmp_path, max_in_flight=16) as served:
        for i in range(8):  # 2 MiB of batches: every fetch answers with a file range (a descriptor each)
            await served.partition.append(batch(os.urandom(256 * 1024), b"%d" % i), Acks.LEADER, BOUND)
        client = await Peer.connect(served.port)
        await produce_answered(client, 1)
        before = open_descriptors()
        tracemalloc.start()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # and never read from it
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", served.port))
        greedy = await Peer.connect(served.port, sock)
        sent = 0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):  # pipeline until the broker stops reading and the socket fills
                while sent < 20_000:
                    for _ in range(100):
                        sent += 1
                        greedy.send(sent, FetchRequest("s", 0, 0, max_bytes=4 * 1024 * 1024, max_wait_ms=0))
                    await greedy.writer.drain()
        assert sent > 1000
        await produce_answered(client, 2)  # served meanwhile
        grown, _ = tracemalloc.get_traced_memory()  # the greedy client's unsent requests included
        tracemalloc.stop()
        held = open_descriptors() - before
        assert held <= 16 + 8, f"{held} descriptors held for a client that reads nothing"
        assert grown < 8 * 1024 * 1024, f"{grown:,} bytes allocated for {sent:,} requests never read"
        greedy.close()
        client.close()


def test_the_limits_count_by_address_and_release() -> None:
    limits = ConnectionLimits(3, 2)
    assert limits.admit("a") is None and limits.admit("a") is None
    assert "wire_max_connections_per_ip" in (limits.admit("a") or "")
    assert limits.admit("b") is None
    assert "(wire_max_connections)" in (limits.admit("c") or "")
    limits.release("a")
    assert limits.admit("c") is None
    assert limits.open == 3
    unlimited = ConnectionLimits(0, 0)  # the default: no limit
    assert all(unlimited.admit("a") is None for _ in range(10_000))


def test_the_open_file_limit_is_raised_to_fit_or_the_broker_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    raised: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "setrlimit", lambda _which, limits: raised.append(limits))
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (1024, 65536))
    assert ensure_descriptors(4096, reserve=1024) == 5120
    assert raised == [(5120, 65536)]
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (1024, 4096))
    with pytest.raises(ConfigError, match=r"needs an open-file limit of 5120; .* at most 4096 \(ulimit -Hn\)"):
        ensure_descriptors(4096, reserve=1024)
    assert ensure_descriptors(0) == 1024  # no limit set: nothing to fit, nothing changed
    assert len(raised) == 1
