"""The controller against a real etcd: failover, ISR shrinks, balancing, controlled shutdown, AlterIsr, fencing,
and the fast death hint.

Brokers are simulated: each is a :class:`BrokerRecord` put under a lease the test holds, so revoking the lease
"kills" the broker exactly as a lapsed lease would, only at once. A controller is a full node (its own etcd
client, mirror, election and :class:`Controller`), as in a broker. The test watches etcd through a mirror of its
own, and waits on conditions, never on fixed sleeps.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys

import msgspec
import pytest

from tests.helpers import LONG_BOUND
from tidelog.metadata.broker_probe import ProbeOutcome
from tidelog.metadata.controller import Controller
from tidelog.metadata.controller_plans import AlterIsrError, AlterIsrRejection
from tidelog.metadata.fenced_writer import ControllerFencedError, NotControllerError
from tidelog.metadata.records import PartitionRecord, StreamRecord, encode
from tidelog.metadata.store import CreateOutcome
from tidelog.metadata.suspension import LeaderBounds, SuspensionError

from . import helpers as harness
from .helpers import Cluster, part

etcd = harness.etcd  # the harness's fixtures: one etcd for this module, a fresh prefix per test
cluster = harness.cluster

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


# ---- failover ----


async def test_the_controller_fails_over_a_dead_leader_within_the_isr(cluster: Cluster) -> None:
    for b in "abc":
        await cluster.up(b)
    await cluster.stream("s", part("s", "abc", "a", "abc", 4), part("s", "cab", "c", "ca", 2, pid=1))
    await (await cluster.node("ctl")).active()

    await cluster.kill("a")
    assert await cluster.partition_becomes("s", 0, lambda p: p.leader != "a") == part("s", "abc", "b", "bc", 5)
    # Partition 1 keeps its leader; a only leaves its ISR, without an epoch bump.
    assert await cluster.partition_becomes("s", 1, lambda p: "a" not in p.isr) == part("s", "cab", "c", "c", 2, pid=1)

    await cluster.kill("b")
    assert await cluster.partition_becomes("s", 0, lambda p: p.leader != "b") == part("s", "abc", "c", "c", 6)


async def test_the_controller_acts_on_what_happened_before_its_election(cluster: Cluster) -> None:
    for b in "ab":
        await cluster.up(b)
    await cluster.stream("s", part("s", "ab", "a", "ab"))
    await cluster.kill("a")
    await (await cluster.node("ctl")).active()
    assert await cluster.partition_becomes("s", 0, lambda p: p.leader == "b") == part("s", "ab", "b", "b", 1)


async def test_no_election_outside_the_isr_unless_the_stream_opts_in(cluster: Cluster) -> None:
    for b in "ab":
        await cluster.up(b)
    await cluster.stream("clean", part("clean", "ab", "a", "a", 3))
    await cluster.stream("dirty", part("dirty", "ab", "a", "a", 3), unclean=True)
    await (await cluster.node("ctl")).active()

    await cluster.kill("a")
    # The clean stream goes offline (the epoch bump fences a), keeping its ISR for a's return.
    assert await cluster.partition_becomes("clean", 0, lambda p: p.leader != "a") == part("clean", "ab", "", "a", 4)
    assert await cluster.partition_becomes("dirty", 0, lambda p: p.leader != "a") == part("dirty", "ab", "b", "b", 4)

    await cluster.up("a", started_ns=1)
    assert await cluster.partition_becomes("clean", 0, lambda p: p.leader == "a") == part("clean", "ab", "a", "a", 5)
    assert cluster.partition("dirty") == part("dirty", "ab", "b", "b", 4)  # a is back, but out of the ISR


async def test_the_broker_default_allows_unclean_election(cluster: Cluster) -> None:
    for b in "ab":
        await cluster.up(b)
    await cluster.stream("s", part("s", "ab", "a", "a"))
    await cluster.stream("never", part("never", "ab", "a", "a"), unclean=False)
    await (await cluster.node("ctl", unclean_default=True)).active()

    await cluster.kill("a")
    assert await cluster.partition_becomes("s", 0, lambda p: p.leader != "a") == part("s", "ab", "b", "b", 1)
    assert await cluster.partition_becomes("never", 0, lambda p: p.leader != "a") == part("never", "ab", "", "a", 1)


async def test_a_dead_follower_leaves_the_isr(cluster: Cluster) -> None:
    for b in "abc":
        await cluster.up(b)
    await cluster.stream("s", part("s", "abc", "a", "abc", 7))
    await (await cluster.node("ctl")).active()

    await cluster.kill("c")
    assert await cluster.partition_becomes("s", 0, lambda p: p.isr != ("a", "b", "c")) == part("s", "abc", "a", "ab", 7)


# ---- balance ----


async def test_balance_returns_leadership_to_the_preferred_replica_once_it_is_in_the_isr(cluster: Cluster) -> None:
    for b in "abc":
        await cluster.up(b)
    await cluster.stream("s", part("s", "abc", "b", "bc", 3), part("s", "bca", "b", "bca", pid=1))
    ctl = await (await cluster.node("ctl")).active()

    assert await ctl.balance_now() == 0  # a is alive but still catching up: out of the ISR, so it must not lead
    assert cluster.partition("s") == part("s", "abc", "b", "bc", 3)

    # a rejoins the ISR (its leader asks), and the periodic balance of a second controller moves it back.
    await ctl.alter_isr("s", 0, "b", 3, ["a", "b", "c"])
    node = cluster.nodes[0]
    await node.election.stop()
    await node.controller.stop()
    balancer = await (await cluster.node("balancer", balance_interval=0.2, balance_initial_delay=0.0)).active()
    assert await cluster.partition_becomes("s", 0, lambda p: p.leader == "a") == part("s", "abc", "a", "abc", 4)
    assert cluster.partition("s", 1) == part("s", "bca", "b", "bca", pid=1)  # already preferred: no switch
    assert await balancer.balance_now() == 0


# ---- controlled shutdown ----


async def test_controlled_shutdown_hands_leadership_off(cluster: Cluster) -> None:
    for b in "abc":
        await cluster.up(b)
    await cluster.stream(
        "s",
        part("s", "abc", "a", "abc", 2),
        part("s", "bac", "b", "bac", pid=1),
        part("s", "a", "a", "a", pid=2),
    )
    ctl = await (await cluster.node("ctl")).active()

    assert await ctl.controlled_shutdown("a") == 1  # partition 2 has no other replica
    assert ctl.shutting_down == {"a"}
    snap = await cluster.wait(
        lambda s: s.partitions[("s", 0)].leader == "b" and s.partitions[("s", 1)].isr == ("b", "c")
    )
    assert snap.partitions[("s", 0)] == part("s", "abc", "b", "bc", 3)
    assert snap.partitions[("s", 1)] == part("s", "bac", "b", "bc", pid=1)

    # While a is leaving it is not elected, and cannot rejoin an ISR.
    await cluster.kill("b")
    assert await cluster.partition_becomes("s", 0, lambda p: p.leader != "b") == part("s", "abc", "c", "c", 4)
    with pytest.raises(AlterIsrError) as refused:
        await ctl.alter_isr("s", 0, "c", 4, ["a", "c"])
    assert refused.value.reason is AlterIsrRejection.INVALID_ISR

    # a restarts (a new registration): it is an ordinary broker again.
    await cluster.kill("a")
    await cluster.up("a", started_ns=1)
    assert ctl.shutting_down == frozenset()
    await ctl.alter_isr("s", 0, "c", 4, ["a", "c"])


# ---- AlterIsr ----


async def test_alter_isr_validates_the_leader_and_its_epoch(cluster: Cluster) -> None:
    for b in "abc":
        await cluster.up(b)
    await cluster.stream("s", part("s", "abc", "a", "ab", 5))
    ctl = await (await cluster.node("ctl")).active()

    async def refused(leader: str, epoch: int, isr: list[str]) -> AlterIsrRejection:
        with pytest.raises(AlterIsrError) as caught:
            await ctl.alter_isr("s", 0, leader, epoch, isr)
        return caught.value.reason

    assert await refused("a", 4, ["a"]) is AlterIsrRejection.STALE_EPOCH
    assert await refused("a", 6, ["a"]) is AlterIsrRejection.NEWER_EPOCH
    assert await refused("b", 5, ["b"]) is AlterIsrRejection.NOT_LEADER
    assert await refused("a", 5, ["c"]) is AlterIsrRejection.INVALID_ISR
    assert await refused("a", 5, ["a", "z"]) is AlterIsrRejection.INVALID_ISR
    with pytest.raises(AlterIsrError) as unknown:
        await ctl.alter_isr("nope", 0, "a", 5, ["a"])
    assert unknown.value.reason is AlterIsrRejection.UNKNOWN_PARTITION
    assert cluster.partition("s") == part("s", "abc", "a", "ab", 5)

    assert await ctl.alter_isr("s", 0, "a", 5, ["c", "a", "b"]) == part("s", "abc", "a", "abc", 5)
    assert await cluster.partition_becomes("s", 0, lambda p: len(p.isr) == 3) == part("s", "abc", "a", "abc", 5)
    assert await ctl.alter_isr("s", 0, "a", 5, ["a"]) == part("s", "abc", "a", "a", 5)


async def test_alter_isr_checks_etcd_when_its_mirror_lags_the_leader(cluster: Cluster) -> None:
    for b in "ab":
        await cluster.up(b)
    await cluster.stream("s", part("s", "ab", "a", "a", 1))
    node = await cluster.node("ctl")
    ctl = await node.active()
    await node.mirror.stop()  # from now on the controller's mirror knows only epoch 1
    newer = part("s", "ab", "b", "b", 2)
    await cluster.admin.put(cluster.keys.partition("s", 0), encode(newer))

    assert await ctl.alter_isr("s", 0, "b", 2, ["b", "a"]) == part("s", "ab", "b", "ab", 2)
    assert await cluster.partition_becomes("s", 0, lambda p: p.isr == ("a", "b")) == part("s", "ab", "b", "ab", 2)


async def test_an_isr_its_lagging_mirror_already_shows_is_still_written_when_etcd_differs(cluster: Cluster) -> None:
    """The leader takes an answered AlterIsr as written (it stops counting a joining follower on it): "nothing to
    write" by a mirror that has not seen the join yet would leave that follower in the ISR."""
    for b in "ab":
        await cluster.up(b)
    await cluster.stream("s", part("s", "ab", "a", "a", 1))
    node = await cluster.node("ctl")
    ctl = await node.active()
    await node.mirror.stop()  # the mirror keeps ISR a
    await cluster.admin.put(cluster.keys.partition("s", 0), encode(part("s", "ab", "a", "ab", 1)))  # b joined

    assert await ctl.alter_isr("s", 0, "a", 1, ["a"]) == part("s", "ab", "a", "a", 1)
    assert await cluster.partition_becomes("s", 0, lambda p: p.isr == ("a",)) == part("s", "ab", "a", "a", 1)


# ---- requests need the controller; a deposed one cannot write ----


async def test_only_the_controller_answers_and_it_writes_streams_fenced(cluster: Cluster) -> None:
    await cluster.up("a")
    first = await cluster.node("x")
    ctl = await first.active()
    second = await cluster.node("y")
    await second.election.wait_for(lambda e: e.controller_id == "x", LONG_BOUND)
    with pytest.raises(NotControllerError) as caught:
        await second.controller.controlled_shutdown("a")
    assert caught.value.controller_id == "x"
    with pytest.raises(NotControllerError):
        await second.controller.alter_isr("s", 0, "a", 0, ["a"])

    detached = Controller("z", cluster.admin, cluster.keys, second.mirror)
    with pytest.raises(NotControllerError):
        await detached.create_stream(StreamRecord("s", "subj", "", 1, 1, 0), [])
    with pytest.raises(RuntimeError):
        second.controller.attach(first.election)

    stream = StreamRecord("s", "subj", "", 1, 1, 0)
    parts = [part("s", "a", "a", "a")]
    assert await ctl.create_stream(stream, parts) is CreateOutcome.CREATED
    assert await ctl.create_stream(stream, parts) is CreateOutcome.SAME_EXISTS
    assert await ctl.create_stream(msgspec.structs.replace(stream, subject="other"), parts) is CreateOutcome.CONFLICT
    await cluster.wait(lambda s: s.partition("s", 0) is not None)
    paused = msgspec.structs.replace(parts[0], paused=True)
    assert await ctl.update_partition(parts[0], paused)
    assert not await ctl.update_partition(parts[0], paused)  # etcd no longer holds the old record
    assert await ctl.delete_stream("s")
    assert not await ctl.delete_stream("s")
    await cluster.wait(lambda s: "s" not in s.streams and not s.partitions)


async def test_a_deposed_controller_cannot_write(cluster: Cluster) -> None:
    for b in "abc":
        await cluster.up(b)
    await cluster.stream("s", part("s", "abc", "a", "abc"))
    proxy = await cluster.proxy()
    x = await cluster.node("x", proxy=proxy)
    old = await x.active()
    y = await cluster.node("y")
    await y.election.wait_for(lambda e: e.controller_id == "x", LONG_BOUND)

    proxy.pause()  # x is cut off from etcd (as if paused) past its lease; y takes over
    new = await y.active()
    await cluster.kill("a")
    assert await cluster.partition_becomes("s", 0, lambda p: p.leader != "a") == part("s", "abc", "b", "bc", 1)

    # x still believes it is the controller: its write goes out and etcd refuses it when x is heard again.
    assert old.active
    current = cluster.partition("s")
    write = asyncio.create_task(old.update_partition(current, msgspec.structs.replace(current, leader="c")))
    shutdown = asyncio.create_task(old.controlled_shutdown("b"))  # x's view: b follows in the ISR of s/0
    await asyncio.sleep(0)  # let the requests leave (into the paused proxy)
    proxy.resume()
    for request in (write, shutdown):
        with pytest.raises(ControllerFencedError) as fenced:
            await request
        assert fenced.value.step == "fence"  # refused by etcd itself, not by x's own belief
    await old.wait_for(lambda c: not c.active, LONG_BOUND)
    with pytest.raises(NotControllerError):
        await old.controlled_shutdown("b")
    assert cluster.partition("s") == part("s", "abc", "b", "bc", 1)
    assert new.active
    assert await new.controlled_shutdown("b") == 0


# ---- the fast death hint ----


def refused_port() -> int:
    """A loopback port that nothing listens on (it was free a moment ago)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_report_unreachable_revokes_only_on_a_refused_connect(cluster: Cluster) -> None:
    listener = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    stopped = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import socket,sys\ns=socket.socket();s.bind(('127.0.0.1',0));s.listen(16)\n"
        "print(s.getsockname()[1],flush=True)\nsys.stdin.read()",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert stopped.stdout is not None and stopped.stdin is not None
        stopped_port = int((await stopped.stdout.readline()).decode())
        os.kill(stopped.pid, signal.SIGSTOP)
        await cluster.up("alive", wire_port=int(listener.sockets[0].getsockname()[1]))
        await cluster.up("paused", wire_port=stopped_port)
        await cluster.up("dead", wire_port=refused_port())
        await cluster.up("b")
        await cluster.stream("s", part("s", ["dead", "b"], "dead", ["dead", "b"]))
        ctl = await (await cluster.node("ctl")).active()

        assert await ctl.report_unreachable("b", "alive") is ProbeOutcome.REACHABLE
        assert await ctl.report_unreachable("b", "paused") is ProbeOutcome.REACHABLE  # the kernel still accepts
        assert await ctl.report_unreachable("b", "nobody") is ProbeOutcome.NOT_REGISTERED
        outcomes = await asyncio.gather(*(ctl.report_unreachable("b", "dead") for _ in range(3)))
        assert outcomes == [ProbeOutcome.REVOKED] * 3  # one probe, shared
        await cluster.wait(lambda s: "dead" not in s.brokers)
        cluster.leases.pop("dead")
        assert await cluster.partition_becomes("s", 0, lambda p: p.leader == "b")
        assert {"alive", "paused", "b"} <= set((await cluster.wait(lambda s: True)).brokers)
    finally:
        listener.close()
        if stopped.returncode is None:
            os.kill(stopped.pid, signal.SIGCONT)
            assert stopped.stdin is not None
            stopped.stdin.close()
            await stopped.wait()


# ---- fail to safety ----


async def test_a_suspension_outlives_failover_until_reset_head_confirms_the_head(cluster: Cluster) -> None:
    for b in "abc":
        await cluster.up(b)
    await cluster.stream("s", part("s", "abc", "a", "ab", 3))
    ctl = await (await cluster.node("ctl")).active()

    with pytest.raises(SuspensionError, match="stale-epoch"):  # a deposed leader's finding is not recorded
        await ctl.suspend_partition("s", 0, "a", 2, "old news")
    written = await ctl.suspend_partition("s", 0, "a", 3, "replica b fetched from offset 9")
    assert (written.suspended, written.leader_epoch) == ("replica b fetched from offset 9", 3)
    assert await cluster.partition_becomes("s", 0, lambda p: bool(p.suspended)) == written
    assert await ctl.suspend_partition("s", 0, "a", 3, "more") == written  # the first evidence stands

    await cluster.kill("a")  # the next leader refuses appends too: the suspension is the partition's
    failed_over = await cluster.partition_becomes("s", 0, lambda p: p.leader == "b")
    assert (failed_over.leader_epoch, failed_over.suspended) == (4, written.suspended)

    asked: list[PartitionRecord] = []

    async def bounds_of(record: PartitionRecord) -> LeaderBounds:
        asked.append(record)
        return LeaderBounds(record.leader_epoch, 5, 7)

    with pytest.raises(SuspensionError, match="bad-offset"):
        await ctl.reset_head("s", 0, 8, bounds_of)
    old, new, bounds = await ctl.reset_head("s", 0, 6, bounds_of)
    assert old == failed_over and bounds == LeaderBounds(4, 5, 7)
    resumed = {"suspended": "", "suspended_ns": 0, "leader_epoch": 5, "head_epoch": 5, "head_offset": 6}
    assert new == msgspec.structs.replace(failed_over, **resumed)
    assert await cluster.partition_becomes("s", 0, lambda p: p.leader_epoch == 5) == new
    assert asked[-1] == failed_over

    with pytest.raises(SuspensionError, match="not-suspended"):
        await ctl.reset_head("s", 0, None, bounds_of)


async def test_reset_head_needs_a_live_leader(cluster: Cluster) -> None:
    for b in "ab":
        await cluster.up(b)
    suspended = msgspec.structs.replace(part("s", "ab", "a", "a", 2), suspended="lost")
    await cluster.stream("s", suspended)
    ctl = await (await cluster.node("ctl")).active()
    await cluster.kill("a")
    await cluster.partition_becomes("s", 0, lambda p: p.leader == "")  # offline: b is out of the ISR

    async def never(record: PartitionRecord) -> LeaderBounds:
        raise AssertionError("no leader to ask")

    with pytest.raises(SuspensionError, match="no-leader") as info:
        await ctl.reset_head("s", 0, None, never)
    assert info.value.retriable
    with pytest.raises(SuspensionError, match="unknown-partition"):
        await ctl.reset_head("s", 7, None, never)
