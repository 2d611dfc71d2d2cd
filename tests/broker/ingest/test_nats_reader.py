"""The ingest's NATS subscriber, against a real nats-server and against a scripted one.

The real server (``EmbeddedNats`` on free ports) shows that what a nats-py publisher sends arrives whole and in
order, in every shape, through queue groups and restarts, to each of the subscriptions a connection carries, and that
pausing one subscription leaves the others flowing. The scripted server
(:class:`ScriptedServer`) plays the parts a real one will not play on demand: refusing the handshake, requiring
TLS, PINGing, going silent, sending garbage.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
import pytest_asyncio

from tests.broker.helpers import bounded
from tests.helpers import BOUND
from tidelog.broker.embedded import EmbeddedNats
from tidelog.broker.ingest.nats_connection import NatsServerError, ServerAddress, UnsupportedServerError, supports
from tidelog.broker.ingest.nats_reader import NatsReader, ReaderState
from tidelog.broker.ingest.natsproto import Item, Msg

pytestmark = pytest.mark.asyncio(loop_scope="module")


class Inbox:
    """Collects what a reader delivers; lets a test wait for a number of messages."""

    def __init__(self, grew: asyncio.Event | None = None) -> None:
        self.items: list[Item] = []
        self.reads = 0
        self.grew = grew or asyncio.Event()  # may be shared by several inboxes

    def __call__(self, items: list[Item], received_ns: int) -> None:
        assert received_ns > 0
        self.items += items
        self.reads += 1
        self.grew.set()

    async def wait_for(self, count: int, *others: Inbox) -> list[Item]:
        """Wait until this inbox (and ``others``, which share its event) hold ``count`` messages together."""
        async with asyncio.timeout(BOUND):
            while len(self.items) + sum(len(other.items) for other in others) < count:
                self.grew.clear()
                await self.grew.wait()
        return self.items

    def payloads(self) -> list[bytes]:
        return [item.payload if isinstance(item, Msg) else bytes(item) for item in self.items]


async def open_reader(
    urls: list[str], subject: str, inbox: Inbox, *, queue: str | None = None, **options: Any
) -> NatsReader:
    """A started reader carrying one subscription, confirmed by the server."""
    reader = NatsReader(urls, **options)
    await reader.start()
    reader.add(subject, inbox, queue)
    await reader.confirm()
    return reader


@contextlib.asynccontextmanager
async def reading(
    url: str, subject: str, inbox: Inbox | None = None, *, queue: str | None = None, **options: Any
) -> AsyncIterator[tuple[NatsReader, Inbox]]:
    inbox = inbox or Inbox()
    reader = await open_reader([url], subject, inbox, queue=queue, **options)
    try:
        yield reader, inbox
    finally:
        await reader.stop()


@contextlib.asynccontextmanager
async def publisher(url: str) -> AsyncIterator[Any]:
    nc = await nats.connect(url, connect_timeout=BOUND, allow_reconnect=False, pending_size=32 * 1024 * 1024)
    try:
        yield nc
    finally:
        await nc.close()


def connected(reader: NatsReader) -> bool:
    return reader.state is ReaderState.CONNECTED


def nats_config(path: Path, **settings: Any) -> list[str]:
    """``extra_args`` for an ``EmbeddedNats`` with these server settings."""
    path.mkdir(parents=True, exist_ok=True)
    conf = path / "test.conf"
    conf.write_text("".join(f"{key}: {json.dumps(value)}\n" for key, value in settings.items()), encoding="utf-8")
    return ["-c", str(conf)]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EmbeddedNats]:
    path = tmp_path_factory.mktemp("nats")
    started = EmbeddedNats(path, extra_args=nats_config(path, max_payload=8 * 1024 * 1024))
    await started.start()
    try:
        yield started
    finally:
        await started.stop()


# ---------------------------------------------------------------------------------------------- a real server


async def test_every_shape_arrives_in_order(server: EmbeddedNats) -> None:
    async with reading(server.url, "shapes.in") as (_, inbox), publisher(server.url) as nc:
        await nc.publish("shapes.in", b"plain")
        await nc.publish("shapes.in", b"with reply", reply="inbox.1")
        await nc.publish("shapes.in", b"with headers", headers={"X-Trace": "abc"})
        await nc.publish("shapes.in", b"")
        await nc.flush()
        items = await inbox.wait_for(4)
    assert items[0] == b"plain"  # a view of the read
    assert items[1] == Msg(b"shapes.in", b"1", b"inbox.1", b"with reply", None)
    assert isinstance(items[2], Msg) and items[2].payload == b"with headers"
    assert items[2].headers is not None and b"X-Trace: abc\r\n" in items[2].headers
    assert items[3] == b""


async def test_wildcards_deliver_the_subject(server: EmbeddedNats) -> None:
    async with reading(server.url, "wild.*") as (_, inbox), publisher(server.url) as nc:
        for subject in ("wild.a", "wild.b.c", "wild.b"):
            await nc.publish(subject, subject.encode())
        await nc.flush()
        items = await inbox.wait_for(2)
    assert [(m.subject, m.payload) for m in items if isinstance(m, Msg)] == [
        (b"wild.a", b"wild.a"),
        (b"wild.b", b"wild.b"),
    ]


async def test_stop_delivers_everything_sent_before_it(server: EmbeddedNats) -> None:
    count = 20_000
    async with publisher(server.url) as nc:
        reader_inbox = Inbox()
        reader = await open_reader([server.url], "drain.in", reader_inbox)
        for i in range(count):
            await nc.publish("drain.in", b"m%06d" % i)
        # Twice (see helpers.subscribed): then the server has routed them all, ahead of our UNSUB's PONG.
        await nc.flush()
        await nc.flush()
        await reader.stop()
        await nc.publish("drain.in", b"after")
        await nc.flush()
    assert reader_inbox.payloads() == [b"m%06d" % i for i in range(count)]
    assert reader.state is ReaderState.CLOSED
    assert reader_inbox.reads < count // 10  # read in bulk, not message by message


async def test_large_payloads_cross_many_reads(server: EmbeddedNats) -> None:
    big = bytes(range(256)) * (5 * 4096)  # 5 MiB
    async with reading(server.url, "big.in") as (_, inbox), publisher(server.url) as nc:
        await nc.publish("big.in", b"before")
        await nc.publish("big.in", big)
        await nc.publish("big.in", b"after")
        await nc.flush()
        await inbox.wait_for(3)
    assert inbox.payloads() == [b"before", big, b"after"]


async def test_queue_group_members_share_the_messages(server: EmbeddedNats) -> None:
    count = 400
    grew = asyncio.Event()
    async with (
        reading(server.url, "group.in", Inbox(grew), queue="workers") as (_, first),
        reading(server.url, "group.in", Inbox(grew), queue="workers") as (_, second),
        publisher(server.url) as nc,
    ):
        for i in range(count):
            await nc.publish("group.in", b"%d" % i)
        await nc.flush()
        await first.wait_for(count, second)
    assert sorted(first.payloads() + second.payloads()) == sorted(b"%d" % i for i in range(count))
    assert first.items and second.items


async def test_reconnects_and_subscribes_again_after_a_restart(tmp_path: Path) -> None:
    own = EmbeddedNats(tmp_path)
    await own.start()
    try:
        async with reading(own.url, "restart.in", reconnect_wait=0.05) as (reader, inbox):
            async with publisher(own.url) as nc:
                await nc.publish("restart.in", b"before")
                await nc.flush()
                await inbox.wait_for(1)
            await own.stop()
            await own.start()  # same port
            await bounded(reader.wait_until(connected))
            assert (reader.state, reader.disconnects) == (ReaderState.CONNECTED, 1)
            async with publisher(own.url) as nc:
                await nc.publish("restart.in", b"after")
                await nc.flush()
                await inbox.wait_for(2)
        assert inbox.payloads() == [b"before", b"after"]
    finally:
        await own.stop()


async def test_a_start_without_a_server_keeps_trying(tmp_path: Path) -> None:
    own = EmbeddedNats(tmp_path)
    await own.start()
    url = own.url
    await own.stop()
    async with reading(url, "late.in", reconnect_wait=0.05, connect_timeout=1) as (reader, inbox):
        assert reader.state is ReaderState.RECONNECTING
        await own.start()
        try:
            await bounded(reader.wait_until(connected))
            async with publisher(url) as nc:
                await nc.publish("late.in", b"hello")
                await nc.flush()
                await inbox.wait_for(1)
        finally:
            await own.stop()


async def test_server_pings_are_answered(tmp_path: Path) -> None:
    own = EmbeddedNats(tmp_path, extra_args=nats_config(tmp_path, ping_interval="50ms", ping_max=2))
    await own.start()
    try:
        async with reading(own.url, "ping.in") as (reader, inbox):
            await asyncio.sleep(0.5)  # ten server PINGs: a reader that ignored them would be dropped after two
            async with publisher(own.url) as nc:
                await nc.publish("ping.in", b"still here")
                await nc.flush()
                await inbox.wait_for(1)
            assert reader.disconnects == 0
    finally:
        await own.stop()


async def test_a_paused_subscription_leaves_the_others_flowing(server: EmbeddedNats) -> None:
    """Pausing one subscription unsubscribes it alone: the connection keeps delivering the others', and a resume
    subscribes it again (what was published on it meanwhile is not received: NATS core keeps nothing for it)."""
    hot, calm = Inbox(), Inbox()
    async with reading(server.url, "calm.in", calm) as (reader, _), publisher(server.url) as nc:
        sub = reader.add("hot.in", hot)
        await reader.confirm()
        reader.pause(sub)
        await reader.confirm()  # the UNSUB has taken effect
        for i in range(100):
            await nc.publish("hot.in", b"lost %d" % i)
            await nc.publish("calm.in", b"calm %d" % i)
        await nc.flush()
        await calm.wait_for(100)
        reader.resume(sub)
        await reader.confirm()
        await nc.publish("hot.in", b"after")
        await nc.flush()
        await hot.wait_for(1)
        assert hot.payloads() == [b"after"] and calm.payloads() == [b"calm %d" % i for i in range(100)]
        assert (sub.paused, reader.disconnects) == (False, 0)


async def test_a_reconnect_subscribes_every_partition_again(tmp_path: Path) -> None:
    own = EmbeddedNats(tmp_path)
    await own.start()
    inboxes = [Inbox() for _ in range(5)]
    try:
        async with reading(own.url, "again.0", inboxes[0], reconnect_wait=0.05) as (reader, _):
            for i, inbox in enumerate(inboxes[1:], 1):
                reader.add(f"again.{i}", inbox)
            await reader.confirm()
            await own.stop()
            await own.start()  # same port
            await bounded(reader.wait_until(connected))
            await reader.confirm()
            async with publisher(own.url) as nc:
                for i in range(len(inboxes)):
                    await nc.publish(f"again.{i}", b"after %d" % i)
                await nc.flush()
                for i, inbox in enumerate(inboxes):
                    assert await inbox.wait_for(1) == [b"after %d" % i]
            assert (reader.disconnects, reader.load) == (1, len(inboxes))
    finally:
        await own.stop()


async def test_a_socket_paused_for_its_one_subscription_comes_back_after_a_slow_consumer_drop(tmp_path: Path) -> None:
    """Alone on its connection, a paused subscription pauses the socket; then the reader cannot see the server drop it
    (no reads, no EOF): it notices once it reads again, after taking what the kernel had buffered, and subscribes
    again."""
    own = EmbeddedNats(
        tmp_path, extra_args=nats_config(tmp_path, max_pending=256 * 1024, max_payload=65536, write_deadline="100ms")
    )
    await own.start()
    try:
        async with reading(own.url, "slow.in", reconnect_wait=0.05) as (reader, inbox):
            (sub,) = reader.routes.values()
            reader.pause(sub)
            assert reader.socket_paused and not sub.away
            async with publisher(own.url) as nc:
                for _ in range(20):  # 20 MiB: far more than the socket buffers and the server's 256 KiB hold
                    for _ in range(1024):
                        await nc.publish("slow.in", b"x" * 1024)
                    await nc.flush()
                    await nc.flush()
                reader.resume(sub)
                await bounded(reader.wait_until(lambda r: r.disconnects == 1 and connected(r)))
                received = len(inbox.items)
                assert 0 < received < 20 * 1024  # what had reached us before the drop was kept
                await reader.confirm()
                await nc.publish("slow.in", b"after")
                await nc.flush()
                await inbox.wait_for(received + 1)
            assert inbox.payloads()[-1] == b"after"
    finally:
        await own.stop()


@pytest.mark.filterwarnings("ignore:The test <Function test_urls> is marked")
def test_urls() -> None:
    assert ServerAddress.parse("nats://u:p%40ss@h:4333") == ServerAddress("h", 4333, "u", "p@ss")
    assert ServerAddress.parse("nats://s3cret@h") == ServerAddress("h", 4222, token="s3cret")
    assert ServerAddress.parse("127.0.0.1:5000") == ServerAddress("127.0.0.1", 5000)
    assert str(ServerAddress.parse("nats://[::1]:4222")) == "nats://[::1]:4222"
    assert supports(["nats://a:1", "b:2"])
    assert not supports(["nats://a:1", "tls://b:2"])
    assert not supports(["ws://a:1"])
    assert not supports([])


# ---------------------------------------------------------------------------------------------- a scripted server


class ScriptedConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.lines: asyncio.Queue[bytes] = asyncio.Queue()
        self.answer_pings = True

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def expect(self, start: bytes) -> bytes:
        while True:
            line = await bounded(self.lines.get())
            if line.startswith(start):
                return line


class ScriptedServer:
    """Speaks just enough NATS to let a test script the rest: INFO first, PONG to PINGs (unless told not to)."""

    def __init__(self, info: dict[str, Any] | None = None) -> None:
        self.info = {"server_id": "scripted", "max_payload": 1048576, **(info or {})}
        self.connections: asyncio.Queue[ScriptedConnection] = asyncio.Queue()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"nats://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> ScriptedServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        conn = ScriptedConnection(reader, writer)
        writer.write(b"INFO " + json.dumps(self.info).encode() + b"\r\n")
        self.connections.put_nowait(conn)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while line := await reader.readuntil(b"\r\n"):
                if line == b"PING\r\n" and conn.answer_pings:
                    writer.write(b"PONG\r\n")
                conn.lines.put_nowait(line)
        writer.close()


async def test_connect_sends_credentials_and_subscribes() -> None:
    async with ScriptedServer() as fake:
        address = fake.url.replace("nats://", "nats://alice:secret@")
        reader = await open_reader([address], "cred.in", Inbox(), queue="grp", name="n1")
        conn = await bounded(fake.connections.get())
        connect = json.loads((await conn.expect(b"CONNECT "))[len(b"CONNECT ") :])
        assert (connect["user"], connect["pass"], connect["name"]) == ("alice", "secret", "n1")
        assert (connect["verbose"], connect["headers"], connect["pedantic"]) == (False, True, False)
        assert await conn.expect(b"SUB ") == b"SUB cred.in grp 1\r\n"
        stopping = asyncio.create_task(reader.stop())
        assert await conn.expect(b"UNSUB") == b"UNSUB 1\r\n"
        await bounded(stopping)


async def test_a_refused_handshake_fails_start() -> None:
    async with ScriptedServer() as fake:
        reader = NatsReader([fake.url])
        starting = asyncio.create_task(reader.start())
        conn = await bounded(fake.connections.get())
        conn.answer_pings = False
        await conn.expect(b"PING")
        conn.send(b"-ERR 'Authorization Violation'\r\n")
        with pytest.raises(NatsServerError, match="Authorization Violation"):
            await bounded(starting)
        assert reader.state is ReaderState.CLOSED


async def test_a_server_requiring_tls_is_unsupported() -> None:
    async with ScriptedServer({"tls_required": True}) as fake:
        with pytest.raises(UnsupportedServerError):
            await NatsReader([fake.url]).start()


async def test_server_pings_info_and_errors_in_the_stream() -> None:
    async with ScriptedServer() as fake:
        inbox = Inbox()
        reader = await open_reader([fake.url], "mix.in", inbox)
        conn = await bounded(fake.connections.get())
        await conn.expect(b"PING")  # the handshake's
        info = {"server_id": "scripted", "connect_urls": ["10.9.9.9:4999"]}
        conn.send(b"PING\r\nMSG mix.in 1 2\r\nhi\r\nINFO " + json.dumps(info).encode() + b"\r\n")
        assert await conn.expect(b"PONG") == b"PONG\r\n"
        conn.send(b"-ERR 'Permissions Violation for Publish to \"x\"'\r\n+OK\r\nMSG mix.in 1 3\r\nbye\r\n")
        await inbox.wait_for(2)
        assert inbox.items == [b"hi", b"bye"]
        assert ServerAddress("10.9.9.9", 4999) in reader._candidates()  # learned from INFO
        assert reader.disconnects == 0
        await reader.stop()


async def test_garbage_from_the_server_means_a_new_connection() -> None:
    async with ScriptedServer() as fake:
        inbox = Inbox()
        reader = await open_reader([fake.url], "junk.in", inbox, reconnect_wait=0.01)
        first = await bounded(fake.connections.get())
        first.send(b"MSG junk.in 1 2\r\nok\r\nWHAT IS THIS\r\n")
        second = await bounded(fake.connections.get())
        assert await second.expect(b"SUB ") == b"SUB junk.in 1\r\n"
        await bounded(reader.wait_until(connected))
        second.send(b"MSG junk.in 1 5\r\nagain\r\n")
        await inbox.wait_for(2)
        assert inbox.items == [b"ok", b"again"]
        assert reader.disconnects == 1
        await reader.stop()


async def test_unanswered_pings_mean_a_dead_connection() -> None:
    async with ScriptedServer() as fake:
        reader = await open_reader(
            [fake.url], "quiet.in", Inbox(), ping_interval=0.02, max_pings_out=2, reconnect_wait=0.01
        )
        first = await bounded(fake.connections.get())
        first.answer_pings = False  # a half-open connection: nothing comes back
        second = await bounded(fake.connections.get())
        await second.expect(b"SUB ")
        await bounded(reader.wait_until(connected))
        assert reader.disconnects == 1
        await reader.stop()
