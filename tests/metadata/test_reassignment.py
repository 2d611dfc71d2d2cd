"""The controller's reassignments against a real etcd, with brokers simulated by their registrations and the
leaders' AlterIsr by direct writes: a new controller finishes what a dead one started, a target that dies makes
the reassignment wait and cancelling restores the old replicas (or a new plan re-targets it to a live broker and
it completes), a decommission never drops a replica of a partition below min-ISR, a broker gone past the
delay has its replicas re-placed, and a target gone past the delay is replaced in the reassignment's target."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from tests.helpers import LONG_BOUND
from tidelog.metadata import reassignment_plans as plans
from tidelog.metadata.controller import Controller
from tidelog.metadata.controller_election import ControllerElection
from tidelog.metadata.mirror import MetadataMirror
from tidelog.metadata.reassignment import Reassigner
from tidelog.metadata.records import PartitionRecord, encode
from tidelog.protocol.errors import InvalidArgumentError

from . import helpers as harness
from .helpers import TTL, Cluster, Node, part

etcd = harness.etcd
cluster = harness.cluster

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


async def _node(cluster: Cluster, node_id: str, **options: Any) -> tuple[Node, Reassigner]:
    """A controller node with a reassigner, wired as the broker does (before the election starts)."""
    client = await cluster.client()
    mirror = MetadataMirror(client, cluster.keys)
    controller = Controller(node_id, client, cluster.keys, mirror, balance_interval=3600.0)
    reassigner = Reassigner(controller, client, cluster.keys, mirror, tick=0.1, **options)
    election = ControllerElection(
        client,
        cluster.keys,
        node_id,
        ttl_seconds=TTL,
        on_elected=controller.on_elected,
        on_deposed=controller.on_deposed,
        retry_seconds=0.1,
    )
    controller.attach(election)
    await mirror.start()
    await election.start()
    node = Node(node_id, client, mirror, election, controller)
    cluster.nodes.append(node)
    return node, reassigner


async def _set_isr(cluster: Cluster, stream: str, isr: str) -> None:
    """What the leader's AlterIsr would write once the new replicas caught up."""
    record = await cluster.partition_becomes(stream, 0, lambda p: bool(p.reassign_to))
    await cluster.admin.put(cluster.keys.partition(stream, 0), encode(msgspec.structs.replace(record, isr=tuple(isr))))


async def test_a_new_controller_completes_a_reassignment_the_old_one_started(cluster: Cluster) -> None:
    for b in "abc":
        await cluster.up(b)
    await cluster.stream("s", part("s", "ab", "a", "ab", 3))
    first, reassigner = await _node(cluster, "n1", replacement_delay=0)
    await first.active()
    moves = await reassigner.execute([("s", 0, ("c", "b"))])
    assert (moves[0].before, moves[0].after) == (("a", "b"), ("c", "b"))
    await cluster.partition_becomes("s", 0, lambda p: p.reassign_to == ("c", "b"))
    await first.election.stop()  # the controller goes away mid-reassignment
    await first.controller.stop()
    second, _ = await _node(cluster, "n2", replacement_delay=0)
    await second.active()
    await _set_isr(cluster, "s", "abc")  # c caught up
    done = await cluster.partition_becomes("s", 0, lambda p: not p.reassign_to)
    assert (done.replicas, done.isr, done.leader, done.leader_epoch) == (("c", "b"), ("c", "b"), "c", 4)


async def test_a_target_that_dies_makes_it_wait_and_cancel_restores_the_old_replicas(cluster: Cluster) -> None:
    for b in "abc":
        await cluster.up(b)
    await cluster.stream("s", part("s", "ab", "a", "ab"))
    node, reassigner = await _node(cluster, "n1", replacement_delay=0)
    await node.active()
    await reassigner.execute([("s", 0, ("a", "c"))])
    await cluster.kill("c")  # dies while catching up
    snap = await cluster.wait(lambda s: "c" not in s.brokers)
    record = snap.partition("s", 0)
    assert record is not None and record.reassign_to == ("a", "c") and record.replicas == ("a", "b", "c")
    assert plans.progress(record, ("a", "c"), snap.brokers.keys()).state == "waiting"
    with pytest.raises(InvalidArgumentError, match="not a live broker"):
        await reassigner.execute([("s", 0, ("a", "x"))])
    moves = await reassigner.cancel([("s", 0)])
    assert (moves[0].before, moves[0].after) == (("a", "b", "c"), ("a", "b"))
    back = await cluster.partition_becomes("s", 0, lambda p: not p.reassign_to)
    assert back == part("s", "ab", "a", "ab")


async def test_a_target_that_dies_is_replaced_by_a_new_plan_which_completes(cluster: Cluster) -> None:
    for b in "abcd":
        await cluster.up(b)
    await cluster.stream("s", part("s", "ab", "a", "ab"))
    node, reassigner = await _node(cluster, "n1", replacement_delay=0)
    await node.active()
    await reassigner.execute([("s", 0, ("a", "c"))])
    await cluster.kill("c")  # dies while catching up
    await node.mirror.wait_for(lambda s: "c" not in s.brokers, LONG_BOUND)  # the controller's view, not the test's
    with pytest.raises(InvalidArgumentError, match="c is not a live broker"):
        await reassigner.execute([("s", 0, ("c", "d"))])
    moves = await reassigner.execute([("s", 0, ("a", "d"))], throttle_bps=1000)
    assert (moves[0].before, moves[0].after) == (("a", "b"), ("a", "d"))  # before: the plan that moves back
    moving = await cluster.partition_becomes("s", 0, lambda p: p.reassign_to == ("a", "d"))
    assert (moving.replicas, moving.reassign_from, moving.isr, moving.throttle_bps) == (
        ("a", "b", "d"),
        ("a", "b"),
        ("a", "b"),
        1000,
    )
    await _set_isr(cluster, "s", "abd")  # d caught up
    done = await cluster.partition_becomes("s", 0, lambda p: not p.reassign_to)
    assert (done.replicas, done.isr, done.leader) == (("a", "d"), ("a", "d"), "a")


async def test_decommission_below_min_isr_waits_and_removes_nothing(cluster: Cluster) -> None:
    for b in "abcd":
        await cluster.up(b)
    await cluster.stream("s", part("s", "abc", "a", "a"))  # rf 3, min_isr 2: one replica in sync
    node, reassigner = await _node(cluster, "n1", replacement_delay=0)
    await node.active()
    moves = await reassigner.decommission("c")
    assert [(m.before, m.after) for m in moves] == [(("a", "b", "c"), ("a", "b", "d"))]
    await _set_isr(cluster, "s", "ad")  # the new replica joins; b still lags
    record = await cluster.partition_becomes("s", 0, lambda p: p.isr == ("a", "d"))
    assert plans.progress(record, ("a", "b", "d"), frozenset("abcd"), 2).state == "in-progress"
    await reassigner.decommission("c")  # a second look changes nothing: c stays until b is back in sync
    assert cluster.partition("s").replicas == ("a", "b", "c", "d")
    await _set_isr(cluster, "s", "abd")
    done = await cluster.partition_becomes("s", 0, lambda p: not p.reassign_to)
    assert (done.replicas, done.isr) == (("a", "b", "d"), ("a", "b", "d"))


async def test_a_broker_gone_past_the_delay_has_its_replicas_replaced(cluster: Cluster) -> None:
    for b in "abcd":
        await cluster.up(b)
    await cluster.stream("s", part("s", "abc", "a", "abc"), part("s", "abd", "a", "abd", pid=1))
    node, _ = await _node(cluster, "n1", replacement_delay=0.3)
    await node.active()
    await cluster.kill("c")
    moving = await cluster.partition_becomes("s", 0, lambda p: bool(p.reassign_to))
    assert moving.reassign_to == ("a", "b", "d") and moving.isr == ("a", "b")  # failover took c out first
    untouched: PartitionRecord = cluster.partition("s", 1)
    assert not untouched.reassign_to
    await _set_isr(cluster, "s", "abd")
    done = await cluster.partition_becomes("s", 0, lambda p: not p.reassign_to)
    assert done.replicas == ("a", "b", "d")


async def test_a_target_gone_past_the_delay_is_replaced_and_cancel_still_restores_the_old_replicas(
    cluster: Cluster,
) -> None:
    for b in "abcd":
        await cluster.up(b)
    await cluster.stream("s", part("s", "ab", "a", "ab"))
    node, reassigner = await _node(cluster, "n1", replacement_delay=0.3)
    await node.active()
    await reassigner.execute([("s", 0, ("a", "c"))], throttle_bps=1000)
    await cluster.kill("c")  # dies while catching up and never registers again
    moving = await cluster.partition_becomes("s", 0, lambda p: p.reassign_to != ("a", "c"))
    assert (moving.replicas, moving.isr, moving.leader, moving.leader_epoch) == (("a", "b", "d"), ("a", "b"), "a", 0)
    assert (moving.reassign_from, moving.reassign_to, moving.throttle_bps) == (("a", "b"), ("a", "d"), 1000)
    verify = plans.progress(moving, ("a", "c"), frozenset("abd"))  # what --verify of the first plan says
    assert (verify.state, verify.detail.split(",")[0]) == ("other", "being reassigned to a")
    assert "instead; c is not running" in verify.detail
    await reassigner.cancel([("s", 0)])
    back = await cluster.partition_becomes("s", 0, lambda p: not p.reassign_to)
    assert back == part("s", "ab", "a", "ab")
