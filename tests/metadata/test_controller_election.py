"""Controller election and fenced controller writes, against a real etcd.

One etcd serves the module; every test works under a prefix of its own. Each candidate has its own etcd client,
as each broker would. A candidate "cut off from etcd" talks to etcd through a :class:`PausableProxy`: pausing it
freezes that candidate's view of etcd and etcd's view of it, which is what a controller paused past its lease
(or partitioned) sees when it wakes. The one real pause, SIGSTOP of a candidate process, is the last test.

Waits are bounded and wait on conditions; the only waiting on time is a lease's TTL running out, which the tests
that need it cannot avoid.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aetcd
import pytest
import pytest_asyncio

from tests.helpers import LONG_BOUND
from tidelog.broker.embedded import EmbeddedEtcd
from tidelog.metadata.controller_election import ControllerElection, DeposedReason, ElectionState
from tidelog.metadata.fenced_writer import ControllerFencedError, ControllerTerm, FencedWriter, NotControllerError
from tidelog.metadata.records import (
    ControllerRecord,
    Keys,
    decode_controller,
    decode_controller_epoch,
    encode_controller_epoch,
)

from .pausable_proxy import PausableProxy

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

TTL = 2  # seconds; etcd's minimum with its default heartbeat is about 1.5
EXPIRY_BOUND = TTL + 4.0  # a lease's TTL, etcd's expiry sweep (every 0.5 s), and a campaign


@dataclass
class Candidate:
    election: ControllerElection
    client: Any
    elected: list[ControllerTerm] = field(default_factory=list)
    deposed: list[tuple[ControllerTerm, DeposedReason]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.election.broker_id


class Cluster:
    """The candidates of one test, on the module's etcd, under the test's own prefix."""

    def __init__(self, etcd: EmbeddedEtcd, keys: Keys) -> None:
        self.etcd = etcd
        self.keys = keys
        self.candidates: list[Candidate] = []
        self.elections: list[ControllerTerm] = []  # every on_elected of every candidate, in the order delivered
        self.admin: Any = None
        self._changed = asyncio.Event()
        self._clients: list[Any] = []
        self._proxies: list[PausableProxy] = []

    async def client(self, proxy: PausableProxy | None = None) -> Any:
        client = aetcd.Client(host=self.etcd.host, port=proxy.port if proxy else self.etcd.client_port, timeout=10)
        await client.connect()
        self._clients.append(client)
        return client

    async def proxy(self) -> PausableProxy:
        proxy = PausableProxy(self.etcd.host, self.etcd.client_port)
        await proxy.start()
        self._proxies.append(proxy)
        return proxy

    async def candidate(
        self, broker_id: str, *, proxy: PausableProxy | None = None, start: bool = True, client: Any = None
    ) -> Candidate:
        client = client or await self.client(proxy)

        async def elected(term: ControllerTerm) -> None:
            candidate.elected.append(term)
            self.elections.append(term)
            self._notify()

        async def deposed(term: ControllerTerm, reason: DeposedReason) -> None:
            candidate.deposed.append((term, reason))
            self._notify()

        election = ControllerElection(
            client,
            self.keys,
            broker_id,
            ttl_seconds=TTL,
            on_elected=elected,
            on_deposed=deposed,
            retry_seconds=0.1,
        )
        candidate = Candidate(election, client)
        self.candidates.append(candidate)
        if start:
            await election.start()
        return candidate

    async def controller(self, *, above_epoch: int = 0) -> Candidate:
        """Wait for a controller elected with an epoch above ``above_epoch``; there must be exactly one."""
        async with asyncio.timeout(LONG_BOUND):
            while True:
                changed = self._changed
                leaders = [c for c in self.candidates if c.election.is_controller and c.election.epoch > above_epoch]
                if leaders:
                    assert len(leaders) == 1, [c.id for c in leaders]
                    return leaders[0]
                await changed.wait()

    async def agree(self, leader: Candidate) -> None:
        """Wait until every running candidate knows ``leader`` as the controller, at its epoch."""
        epoch = leader.election.epoch
        running = [c for c in self.candidates if c.election.state is not ElectionState.STOPPED]
        await asyncio.gather(
            *(
                c.election.wait_for(lambda e: e.controller_id == leader.id and e.epoch == epoch, LONG_BOUND)
                for c in running
            )
        )
        assert [c.id for c in running if c.election.is_controller] == [leader.id]
        assert all(c.election.state is ElectionState.FOLLOWING for c in running if c is not leader)

    async def read(self, key: bytes) -> bytes | None:
        found = await self.admin.get(key)
        return None if found is None else bytes(found.value)

    async def stored_controller(self) -> tuple[ControllerRecord | None, int]:
        """The controller key's record and the epoch key, as etcd has them now."""
        raw, epoch = await self.read(self.keys.controller()), await self.read(self.keys.controller_epoch())
        return (
            decode_controller(raw) if raw is not None else None,
            decode_controller_epoch(epoch) if epoch is not None else 0,
        )

    def data_key(self, name: str) -> bytes:
        return f"{self.keys.prefix}/data/{name}".encode()

    async def close(self) -> None:
        for proxy in self._proxies:
            proxy.resume()
        async with asyncio.timeout(LONG_BOUND):
            for candidate in self.candidates:
                await candidate.election.stop()
        for proxy in self._proxies:
            await proxy.stop()
        for client in self._clients:
            await client.close()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def etcd(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EmbeddedEtcd]:
    async with EmbeddedEtcd(tmp_path_factory.mktemp("etcd")) as server:
        yield server


@pytest_asyncio.fixture(loop_scope="module")
async def cluster(etcd: EmbeddedEtcd, request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    keys = Keys("/t/" + re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name).strip("-"))
    cluster = Cluster(etcd, keys)
    cluster.admin = await cluster.client()
    try:
        yield cluster
    finally:
        await cluster.close()


# ---- election ----


async def test_one_of_three_becomes_controller_and_all_agree(cluster: Cluster) -> None:
    candidates = [await cluster.candidate(f"b{i}") for i in range(3)]
    leader = await cluster.controller()
    await cluster.agree(leader)

    assert leader.elected == [ControllerTerm(leader.id, 1)]
    assert cluster.elections == leader.elected
    assert await cluster.stored_controller() == (ControllerRecord(leader.id, 1), 1)
    found = await cluster.admin.get(cluster.keys.controller())
    assert found.lease == leader.election.lease_id  # bound to the controller's own lease
    assert all(c.deposed == [] for c in candidates)


async def test_concurrent_campaigns_elect_exactly_one(cluster: Cluster) -> None:
    for round_ in range(1, 4):
        candidates = [await cluster.candidate(f"r{round_}-b{i}", start=False) for i in range(5)]
        await asyncio.gather(*(c.election.start() for c in candidates))
        leader = await cluster.controller(above_epoch=round_ - 1)
        await cluster.agree(leader)

        # One transaction won; every other found the key taken. A second winner would have taken another epoch.
        assert [t.epoch for t in cluster.elections] == list(range(1, round_ + 1))
        assert leader.elected == [ControllerTerm(leader.id, round_)]
        assert await cluster.stored_controller() == (ControllerRecord(leader.id, round_), round_)
        await asyncio.gather(*(c.election.stop() for c in candidates))
        assert await cluster.stored_controller() == (None, round_)  # resigned; the epoch stays


async def test_resignation_hands_over_at_once_with_a_higher_epoch(cluster: Cluster) -> None:
    for i in range(3):
        await cluster.candidate(f"b{i}")
    leader = await cluster.controller()
    epochs = [leader.election.epoch]
    for _ in range(4):
        started = time.monotonic()
        await leader.election.stop()
        assert leader.deposed[-1] == (ControllerTerm(leader.id, epochs[-1]), DeposedReason.RESIGNED)
        assert leader.election.state is ElectionState.STOPPED and not leader.election.is_controller

        successor = await cluster.controller(above_epoch=epochs[-1])
        assert time.monotonic() - started < TTL  # the key was deleted: nobody waited for a lease to expire
        assert successor is not leader
        epochs.append(successor.election.epoch)
        await leader.election.start()  # back as a follower
        await cluster.agree(successor)
        leader = successor

    assert epochs == [1, 2, 3, 4, 5]
    assert [t.epoch for t in cluster.elections] == epochs  # one election per epoch, in epoch order


async def test_stopping_a_follower_leaves_the_controller_alone(cluster: Cluster) -> None:
    await cluster.candidate("b0")
    await cluster.candidate("b1")
    leader = await cluster.controller()
    await cluster.agree(leader)
    follower = next(c for c in cluster.candidates if c is not leader)

    await follower.election.stop()
    assert follower.deposed == [] and follower.elected == []
    assert leader.election.is_controller
    assert await cluster.stored_controller() == (ControllerRecord(leader.id, 1), 1)


async def test_a_controller_cut_off_from_etcd_is_replaced_within_the_ttl(cluster: Cluster) -> None:
    proxy = await cluster.proxy()
    a = await cluster.candidate("a", proxy=proxy)
    await a.election.wait_for(lambda e: e.is_controller, LONG_BOUND)
    await cluster.candidate("b")
    await cluster.candidate("c")
    await cluster.agree(a)

    proxy.pause()
    started = time.monotonic()
    successor = await cluster.controller(above_epoch=1)
    assert time.monotonic() - started < EXPIRY_BOUND
    assert successor.id in ("b", "c") and successor.election.epoch == 2
    assert a.election.is_controller  # it has heard nothing yet, so it still believes

    proxy.resume()
    await a.election.wait_for(lambda e: e.controller_id == successor.id and e.epoch == 2, LONG_BOUND)
    assert not a.election.is_controller
    assert len(a.deposed) == 1
    term, reason = a.deposed[0]
    assert term == ControllerTerm("a", 1)
    assert reason in (DeposedReason.KEY_LOST, DeposedReason.LEASE_LOST)
    await cluster.agree(successor)


async def test_a_revoked_lease_is_noticed_and_a_new_one_taken(cluster: Cluster) -> None:
    a = await cluster.candidate("a")
    await a.election.wait_for(lambda e: e.is_controller, LONG_BOUND)
    first_lease = a.election.lease_id
    assert first_lease is not None

    await cluster.admin.revoke_lease(first_lease)  # the key goes with it, exactly as on expiry
    await a.election.wait_for(lambda e: e.is_controller and e.epoch == 2, LONG_BOUND)

    assert [t.epoch for t in a.elected] == [1, 2]
    assert a.deposed[0][0] == ControllerTerm("a", 1)
    assert a.deposed[0][1] in (DeposedReason.KEY_LOST, DeposedReason.LEASE_LOST)
    assert a.election.lease_id not in (None, first_lease)
    found = await cluster.admin.get(cluster.keys.controller())
    assert found.lease == a.election.lease_id


class SwallowsOneCancellation:
    """An etcd client whose next ``watch()`` parks until cancelled, then swallows the cancellation and returns.

    That is what ``asyncio.wait_for`` on Python 3.11 (used by aetcd to create a watch) does when a cancellation
    arrives just as the wait completes; the election must stop all the same.
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self.parked = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def watch(self, *args: Any, **kwargs: Any) -> Any:
        watch = await self._client.watch(*args, **kwargs)
        if not self.parked.is_set():
            self.parked.set()
            with contextlib.suppress(asyncio.CancelledError):  # swallowed
                await asyncio.Event().wait()
        return watch


async def test_stop_ends_the_election_even_if_a_cancellation_is_swallowed(cluster: Cluster) -> None:
    client = SwallowsOneCancellation(await cluster.client())
    a = await cluster.candidate("a", client=client)
    await a.election.wait_for(lambda e: e.is_controller, LONG_BOUND)
    async with asyncio.timeout(LONG_BOUND):
        await client.parked.wait()
        await a.election.stop()
    assert a.deposed == [(ControllerTerm("a", 1), DeposedReason.RESIGNED)]
    assert await cluster.stored_controller() == (None, 1)


# ---- fencing ----


async def test_fenced_writes_commit_and_report_their_own_conflicts(cluster: Cluster) -> None:
    a = await cluster.candidate("a")
    await a.election.wait_for(lambda e: e.is_controller, LONG_BOUND)
    writer = a.election.writer()
    tx = cluster.admin.transactions
    key, other = cluster.data_key("k"), cluster.data_key("other")

    assert await writer.create(key, b"1")
    assert not await writer.create(key, b"2")
    assert not await writer.replace(key, b"not-1", b"3")
    assert await writer.replace(key, b"1", b"3")
    await writer.put(other, b"p")
    result = await writer.transaction(
        compare=[tx.value(key) == b"nope"], success=[tx.put(key, b"4")], failure=[tx.get(key)]
    )
    assert not result.committed
    assert [value for value, _ in result.responses[0]] == [b"3"]  # the caller's failure ops only
    assert not await writer.delete(key, expected=b"nope")
    assert await writer.delete(key, expected=b"3")
    assert not await writer.delete(key)

    assert await cluster.read(key) is None and await cluster.read(other) == b"p"
    assert a.election.is_controller and a.deposed == []  # a conflict is not a fence


async def test_a_follower_gets_no_writer_but_learns_whom_to_forward_to(cluster: Cluster) -> None:
    await cluster.candidate("b0")
    await cluster.candidate("b1")
    leader = await cluster.controller()
    await cluster.agree(leader)
    follower = next(c for c in cluster.candidates if c is not leader)

    with pytest.raises(NotControllerError) as caught:
        follower.election.writer()
    assert caught.value.controller_id == leader.id and caught.value.epoch == 1


async def test_a_deposed_controller_cannot_write(cluster: Cluster) -> None:
    proxy = await cluster.proxy()
    a = await cluster.candidate("a", proxy=proxy)
    await a.election.wait_for(lambda e: e.is_controller, LONG_BOUND)
    writer = a.election.writer()
    assert await writer.create(cluster.data_key("before"), b"a@1")
    b = await cluster.candidate("b")
    await cluster.agree(a)

    proxy.pause()  # a's keep-alives stop reaching etcd: its lease runs out and b is elected
    successor = await cluster.controller(above_epoch=1)
    assert successor is b and b.election.epoch == 2
    assert a.election.is_controller  # a has heard nothing: it believes it is still the controller

    # a wakes up and writes at once: its request reaches etcd together with everything else it missed.
    asyncio.get_running_loop().call_soon(proxy.resume)
    with pytest.raises(ControllerFencedError) as caught:
        await writer.put(cluster.data_key("after"), b"a@1")
    assert caught.value.term == ControllerTerm("a", 1)
    assert caught.value.current == ControllerRecord("b", 2) and caught.value.current_epoch == 2
    assert caught.value.step == "fence"  # refused by etcd, not by a's own (stale) view
    assert not a.election.is_controller  # stepped down before the error reached the caller

    assert await cluster.read(cluster.data_key("after")) is None
    assert await cluster.read(cluster.data_key("before")) == b"a@1"
    await a.election.wait_for(lambda e: e.state is ElectionState.FOLLOWING and e.controller_id == "b", LONG_BOUND)
    assert [term for term, _ in a.deposed] == [ControllerTerm("a", 1)]
    assert b.election.is_controller and await cluster.stored_controller() == (ControllerRecord("b", 2), 2)
    with pytest.raises(ControllerFencedError, match="already ended here"):  # the term's writer stays dead
        await writer.put(cluster.data_key("after"), b"a@1")


async def test_a_fenced_write_alone_makes_the_controller_step_down(cluster: Cluster) -> None:
    a = await cluster.candidate("a")
    await a.election.wait_for(lambda e: e.is_controller, LONG_BOUND)
    writer = a.election.writer()
    # Edit the epoch behind a's back: its key (and so its watch) is untouched, only the fence can tell.
    await cluster.admin.put(cluster.keys.controller_epoch(), encode_controller_epoch(7))

    with pytest.raises(ControllerFencedError) as caught:
        await writer.put(cluster.data_key("k"), b"v")
    assert caught.value.current == ControllerRecord("a", 1) and caught.value.current_epoch == 7
    assert not a.election.is_controller

    # a stepped down, gave up the key it still held, and won the election that followed, past the edited epoch.
    await a.election.wait_for(lambda e: e.is_controller and e.epoch == 8, LONG_BOUND)
    assert a.deposed == [(ControllerTerm("a", 1), DeposedReason.FENCED)]
    assert a.elected == [ControllerTerm("a", 1), ControllerTerm("a", 8)]
    assert await cluster.read(cluster.data_key("k")) is None
    await a.election.writer().put(cluster.data_key("k"), b"v")
    assert await cluster.read(cluster.data_key("k")) == b"v"


async def test_etcd_refuses_every_term_but_the_current_one(cluster: Cluster) -> None:
    await cluster.candidate("b0")
    await cluster.candidate("b1")
    first = await cluster.controller()
    # Writers that know nothing of any election: only etcd's comparison stands between them and the keyspace.
    stale = FencedWriter(cluster.admin, cluster.keys, ControllerTerm(first.id, 1))
    await stale.put(cluster.data_key("k1"), b"1")

    await first.election.stop()
    second = await cluster.controller(above_epoch=1)
    for term in (
        ControllerTerm(first.id, 1),  # the finished term
        ControllerTerm(first.id, 2),  # the old controller with the new epoch
        ControllerTerm(second.id, 1),  # the new controller with the old epoch
    ):
        with pytest.raises(ControllerFencedError) as caught:
            await FencedWriter(cluster.admin, cluster.keys, term).put(cluster.data_key("k2"), b"2")
        assert caught.value.current == ControllerRecord(second.id, 2)
    assert await cluster.read(cluster.data_key("k2")) is None

    await FencedWriter(cluster.admin, cluster.keys, ControllerTerm(second.id, 2)).put(cluster.data_key("k2"), b"2")
    assert await cluster.read(cluster.data_key("k2")) == b"2"
    assert second.election.is_controller  # other writers' refusals are theirs alone


async def test_a_controller_paused_by_sigstop_past_its_lease_cannot_write(cluster: Cluster) -> None:
    script = Path(__file__).with_name("controller_candidate.py")
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        cluster.etcd.host,
        str(cluster.etcd.client_port),
        cluster.keys.prefix,
        "a",
        str(TTL),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert child.stdin is not None and child.stdout is not None
    stdout = child.stdout

    async def lines_until(*prefixes: str) -> dict[str, str]:
        """The first line starting with each of ``prefixes``, in whatever order the candidate says them."""
        found: dict[str, str] = {}
        async with asyncio.timeout(LONG_BOUND):
            while len(found) < len(prefixes):
                line = (await stdout.readline()).decode().strip()
                if not line:
                    raise AssertionError(f"the candidate exited having said only {found}")
                found.update({p: line for p in prefixes if line.startswith(p) and p not in found})
        return found

    try:
        assert await lines_until("elected") == {"elected": "elected 1"}
        b = await cluster.candidate("b")
        await b.election.wait_for(lambda e: e.controller_id == "a", LONG_BOUND)

        os.kill(child.pid, signal.SIGSTOP)
        await b.election.wait_for(lambda e: e.is_controller, LONG_BOUND)  # a's lease ran out while it was stopped
        assert b.election.epoch == 2
        child.stdin.write(b"write " + cluster.data_key("from-a") + b"\n")  # waits in the pipe until a runs again
        await child.stdin.drain()
        os.kill(child.pid, signal.SIGCONT)

        # Whether a hears of b before it gets to the write or after, the write must not land.
        said = await lines_until("write", "deposed")
        assert said["write"].startswith("write refused")
        assert said["deposed"].startswith("deposed 1 ")
        assert await cluster.read(cluster.data_key("from-a")) is None
        assert b.election.is_controller and await cluster.stored_controller() == (ControllerRecord("b", 2), 2)
    finally:
        if child.returncode is None:
            os.kill(child.pid, signal.SIGCONT)
            child.stdin.close()
            try:
                async with asyncio.timeout(LONG_BOUND):
                    await child.wait()
            except TimeoutError:
                child.kill()
                await child.wait()
