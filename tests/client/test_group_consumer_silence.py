"""A member that cannot heartbeat past its consumer timeout stops consuming: it gives its partitions up (calling
``on_revoked``, committing nothing more) rather than reading on as a zombie, and takes them back once its
coordinator answers again. Real processes (a LocalCluster: NATS, etcd, two ``tidelog serve``); the coordinator's
broker is paused with SIGSTOP (by PID), its lease and the coordinator timeout long enough that the group cannot
move elsewhere meanwhile: the member is cut off from its coordinator and nothing else happens."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from tests.client.group_helpers import produce
from tests.helpers import LONG_BOUND
from tidelog.client import Admin, GroupConsumer
from tidelog.client.group_membership import StreamPartition
from tidelog.local.cluster import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

SETTINGS = {
    "broker_lease_ttl_ms": "60000",  # the paused coordinator keeps its registration: no failover by lease
    "group_consumer_timeout_ms": "3000",
    "group_coordinator_timeout_ms": "60000",  # nor by the member reporting it
}


@dataclass(frozen=True)
class Event:
    """What the member did, in order: a rebalance callback (``assigned``, ``revoked``) or a ``record`` handed out."""

    kind: str
    partitions: frozenset[StreamPartition] = frozenset()
    partition: int = -1
    offset: int = -1


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(Path(tmp_path_factory.mktemp("cluster")), 2, settings=SETTINGS) as running:
        yield running


async def test_a_member_cut_off_from_its_coordinator_gives_its_partitions_up(cluster: LocalCluster) -> None:
    stream, group = "silent", "silent-group"
    bootstrap = cluster.bootstrap()
    events: list[Event] = []
    everything = frozenset(StreamPartition(stream, p) for p in range(2))

    def assigned(partitions: frozenset[StreamPartition]) -> None:
        events.append(Event("assigned", partitions))

    def revoked(partitions: frozenset[StreamPartition]) -> None:
        events.append(Event("revoked", partitions))

    def consumed(p: int) -> set[int]:
        return {e.offset for e in events if e.kind == "record" and e.partition == p}

    async with Admin(bootstrap) as admin:
        # One replica each: records go on being written to the partition the live broker leads (its ISR does not
        # wait for the paused one).
        await admin.create_stream(stream, partitions=2, replication_factor=1)
        await produce(bootstrap[0], stream, range(2), 10)
        consumer = GroupConsumer(
            bootstrap,
            stream,
            group_id=group,
            consumer_id="m",
            auto_offset_reset="earliest",
            auto_commit_interval_ms=100,
            on_assigned=assigned,
            on_revoked=revoked,
        )
        paused: str | None = None
        try:
            await consumer.start()

            async def consume_until(done: Callable[[], bool]) -> None:
                async def step() -> bool:
                    record = await consumer.getone(timeout=0.2)
                    if record is not None:
                        events.append(Event("record", partition=record.partition, offset=record.offset))
                    return done()

                await cluster.wait_until(step, LONG_BOUND, "the member to consume")

            await consume_until(lambda: all(consumed(p) >= set(range(10)) for p in range(2)))

            async def committed_all() -> bool:
                await consumer.getone(timeout=0.2)  # auto-commit runs inside the iteration
                return [await admin.fetch_cursor(stream, p, group) for p in range(2)] == [10, 10]

            await cluster.wait_until(committed_all, LONG_BOUND, "the first records committed")

            paused = consumer.coordinator
            await cluster.pause(paused)
            await consume_until(lambda: events[-1] == Event("revoked", everything))
            assert consumer.assignment() == frozenset(), "a member that cannot heartbeat reads nothing"
            revoked_at = len(events)

            records = [await cluster.partition_record(stream, p) for p in range(2)]
            live = [p for p, record in enumerate(records) if record is not None and record.leader != paused]
            live_address = next(b.wire_address for b in cluster.brokers if b.id != paused)
            await produce(live_address, stream, live, 5, first=10)  # new records it must not read while cut off

            await cluster.resume(paused)
            paused = None
            await consume_until(lambda: Event("assigned", everything) in events[revoked_at:])
            await consume_until(lambda: all(consumed(p) >= set(range(10 + 5 * (p in live))) for p in range(2)))
            back = events.index(Event("assigned", everything), revoked_at)
            assert [e for e in events[revoked_at:back] if e.kind == "record"] == [], "nothing read while cut off"
            await consumer.commit()
            expected = [10 + 5 * (p in live) for p in range(2)]
            assert [await admin.fetch_cursor(stream, p, group) for p in range(2)] == expected
        finally:
            if paused is not None:
                with contextlib.suppress(Exception):
                    await cluster.resume(paused)
            await consumer.close()
