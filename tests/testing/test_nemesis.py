"""The nemesis: a plan is a function of its seed, a ring cuts what it should, and a short mixed run of the
process, network, etcd, NATS, membership and clock faults on a real network loses no acknowledged write and shows
no anomaly (the CI gate; ``python -m tidelog.testing.nemesis --time 300 --runs 20`` is the long one)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from tidelog.testing.fault_run import FaultRun
from tidelog.testing.nemesis import (
    BROKER_FAULTS,
    FAULTS,
    MAX_GAP_S,
    MAX_LENGTH_S,
    Plan,
    PlannedFault,
    partition_ring,
    run_nemesis,
)


def test_a_seed_makes_one_plan() -> None:
    first = Plan.make(42, 60, list(FAULTS))
    assert first == Plan.make(42, 60, list(FAULTS))
    assert first != Plan.make(43, 60, list(FAULTS))
    assert sum(step.gap + step.length for step in first.steps) <= 60
    assert sum(step.gap + step.length for step in first.steps) > 60 - MAX_GAP_S - MAX_LENGTH_S


def test_a_plan_says_how_to_replay_it() -> None:
    plan = Plan.make(9, 30, ["kill-one", "pause-one"])
    assert plan.replay == "python -m tidelog.testing.nemesis --seed 9 --time 30 --faults kill-one,pause-one"


def test_a_plan_uses_only_the_faults_asked_for() -> None:
    plan = Plan.make(7, 120, ["pause-one", "kill-one"])
    assert {step.fault for step in plan.steps} == {"pause-one", "kill-one"}


def test_unknown_faults_are_named() -> None:
    with pytest.raises(ValueError, match=r"unknown fault.*set-fire; known: kill-leader"):
        Plan.make(1, 10, ["kill-leader", "set-fire"])
    with pytest.raises(ValueError, match="at least one fault"):
        Plan.make(1, 10, [])


def test_a_ring_cuts_every_pair_of_nodes_but_neighbours() -> None:
    """Five nodes (three brokers, NATS, the etcd members together): each keeps its two neighbours only."""
    cut: set[frozenset[str]] = set()

    class Lab:
        hosts = ("nats", "etcd", "etcd1", "b0", "b1", "b2")

        async def partition(self, side: list[str], other: list[str]) -> None:
            cut.update(frozenset((a, b)) for a in side for b in other)

        async def heal(self) -> None:
            pass

    run = SimpleNamespace(
        lab=Lab(), retired=set(), cluster=SimpleNamespace(brokers=[SimpleNamespace(id=b) for b in ("b0", "b1", "b2")])
    )
    ring, _ = asyncio.run(partition_ring(cast(FaultRun, run), 0.25))
    nodes = [node.split("+") for node in ring.split(" - ")]
    assert sorted(host for node in nodes for host in node) == sorted(Lab.hosts)
    for i, node in enumerate(nodes):
        for j, other in enumerate(nodes):
            apart = min(abs(i - j), len(nodes) - abs(i - j))
            for a in node:
                for b in other:
                    assert (frozenset((a, b)) in cut) == (apart > 1), (a, b)


# One short step of each dependency, membership, clock and wider network fault, after seed 79's plan (their long
# versions: --faults). The broker added first is still taking its replicas while etcd members are paused and killed.
EXTRA_STEPS = (
    PlannedFault(gap=0.5, fault="add-broker", length=0.5, pick=0.3),
    PlannedFault(gap=0.5, fault="partition-ring", length=1.0, pick=0.4),
    PlannedFault(gap=0.5, fault="partition-one-way", length=1.0, pick=0.7),
    PlannedFault(gap=0.5, fault="partition-minority-with-etcd", length=1.0, pick=0.1),
    PlannedFault(gap=0.5, fault="pause-etcd-member", length=2.5, pick=0.0),
    PlannedFault(gap=0.5, fault="kill-etcd-member", length=1.0, pick=0.5),
    PlannedFault(gap=0.5, fault="restart-nats", length=1.0, pick=0.0),
    PlannedFault(gap=0.5, fault="clock-strobe-one", length=1.5, pick=0.2),
    PlannedFault(gap=0.5, fault="clock-jump-one", length=1.5, pick=0.9),
)


@pytest.mark.slow
async def test_a_short_mixed_run_loses_nothing(tmp_path: Path) -> None:
    # Seed 79's plan: pause-one, partition-one, partition-pair, partition-etcd, kill-leader in 24 s.
    seeded = Plan.make(79, 24, list(BROKER_FAULTS))
    assert len({step.fault for step in seeded.steps}) == 5
    faults = (*seeded.faults, *(step.fault for step in EXTRA_STEPS))
    plan = Plan(seeded.seed, seeded.duration, faults, (*seeded.steps, *EXTRA_STEPS))
    result = await run_nemesis(tmp_path, plan)
    print(result)
    assert result.ok, str(result)
    assert result.report.rounds == len(plan.steps) and result.report.acked > 0
    assert set(result.anomalies) >= {"lost-write", "duplicate", "lost-on-node", "replicas-differ"}
    assert not any(result.anomalies.values())
    assert result.phases["quiet"][0] > 0
