"""Consumer groups benchmark: tidelog's group consumer against NATS JetStream's shared durable consumer, in the
same run.

Run: ``.venv/bin/python -m benchmarks.groups [--quick]``. Both servers are started here, one after the other
(never at the same time), on free loopback ports, each with its data in its own directory under one scratch
directory on the same disk, and stopped by PID afterwards; each run starts fresh servers and alternates which
side goes first.

- tidelog: one ``tidelog serve`` with its embedded NATS and etcd (as ``benchmarks.publish`` runs it), settings
  ``TIDELOG_SETTINGS`` below (flush ``always``; the group consumer timeout a setting, ``--consumer-timeout-ms``),
  overridable with ``--setting key=value``. Groups need one broker as much as three (the coordinator and the
  ``__cursors`` partition's leader are that broker), and one broker is the setup of the other single-node
  benchmarks.
- JetStream: one ``nats-server -js``, file storage, ``sync_interval: always`` (tidelog's flush ``always``).

Members run as **processes**, three on each side (``benchmarks._group_members``): the members of a real group are
separate processes, and so they get the machine's cores as JetStream's workers do. Records are 1 KiB distinct
random values, the same list for both sides.

Metrics (``ratio`` = tidelog ÷ JetStream unless said otherwise):

- ``group_consume_1k`` msg/s: three members consume a pre-filled stream, from the moment they are told to start
  until the parent has heard of every record consumed. tidelog: a 6-partition stream; three ``GroupConsumer``
  processes iterating records, auto-committing every ``AUTO_COMMIT_MS`` (100 ms, not the default 5 s, so that
  commits happen during a measurement that lasts about a second). They join once the stream is filled, starting
  at its end (``auto_offset_reset="latest"``: no reader fetches ahead); once the group is balanced (two
  partitions each) and they are told to start, each seeks its partitions to offset 0, so every record is read
  after the start. Afterwards they close (committing) and the committed offsets are checked to be every
  partition's end. JetStream: one stream, one durable pull consumer (explicit acks, no limit on acks pending)
  shared by three worker processes, each ``fetch``-ing ``--js-batch`` messages at a time and ``ack()``-ing each
  one; afterwards the consumer's ack floor is checked to be the last message. A rebalance during the
  measurement is logged (it would re-deliver records: counted twice).
- ``offset_commit`` positions/s, one commit awaited at a time. tidelog: ``GroupConsumer.commit({partition:
  offset})`` by the only member of a group: one SET_CURSOR carrying the member's group context, fenced by the
  broker leading the cursor (``tidelog.client.group_commits``), stored with acks ALL and (flush ``always``)
  fsynced before it is acknowledged. JetStream: ``msg.ack_sync()`` of one message at a time (messages fetched
  beforehand, outside the timing). **The two sides do not promise the same thing**: JetStream acknowledges an
  ack before its consumer state reaches the disk (the state is written behind; under strace, 1,000
  ``ack_sync`` made 7 fsyncs), tidelog after the fsync (1,000 commits, 1,000 ``fdatasync``).
- ``offset_commit_cursor`` (informational, no target) positions/s: tidelog's ``Admin.set_cursor`` (SET_CURSOR
  over the wire protocol, acks ALL) one at a time, without the group's fence; the peer is the same ``ack_sync``.
- ``offset_commit_unsynced`` (informational, no target) positions/s: ``offset_commit`` on a second tidelog broker
  whose flush policy is ``interval`` (``UNSYNCED_SETTINGS``): commits acknowledged once written and replicated,
  fsynced behind, as JetStream's acks are; the comparable durability, beside the same ``ack_sync``.
- ``offset_commit_6`` (informational, no target) positions/s with six commits in flight: tidelog's member of a
  6-partition stream commits all six partitions in one ``commit(offsets)`` (six SET_CURSOR at once, which the
  broker writes as one append: ``tidelog.broker.cursor_writes``); JetStream ``ack_sync``-s six messages at once.
- ``fsync_bound`` (informational) fsyncs/s: a 120-byte write and ``fdatasync`` of a file in the scratch directory,
  one at a time, ``commits`` times: the most commits per second that anything fsyncing each commit before
  acknowledging it, one at a time, can reach on this disk. Beside ``ack_sync``: an ``offset_commit`` ratio of 2
  needs a commit, round trip included, in half an ``ack_sync``; where ``fsync_bound``'s ratio is under 2 the
  disk alone rules it out under flush ``always``.
- ``rebalance_s`` seconds, from the SIGKILL (by PID) of a member process to the first record of each of its
  partitions handed out by the surviving members, while a producer in the parent keeps writing one record per
  partition every ``TRICKLE_EVERY`` seconds. The peer is the configured group consumer timeout (``ratio`` =
  measured ÷ timeout): a member is removed only after it, by design. Between samples a new member joins and
  the group is balanced again.

Each value is the median over all samples of all runs. The last line is the summary with the targets, the
consumer timeout and the load average before and after (the machine may be shared).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import nats
from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig

from benchmarks._common import Row, RunClock, Target, log, median, report, scratch_dir
from benchmarks._group_members import Event, MemberProcess
from benchmarks._jetstream import JS_PUBLISH_WINDOW, JetStreamServer, publish_all
from benchmarks._publish_sides import TidelogServer, deadline_for, make_payloads
from tidelog.client import Acks, Admin, Cluster, Codec, GroupConsumer, Producer, StreamPartition

BENCH = "groups"
SIZE = 1024
PARTITIONS = 6
MEMBERS = 3
TARGETS = (
    Target("group_consume_1k", ">=", 3),
    Target("offset_commit", ">=", 2),
    Target("rebalance_s", "<=", 1.2),
)

TIDELOG_SETTINGS: dict[str, str] = {
    "default_flush_policy": "always",  # fsync before an append counts (JetStream: sync_interval always)
    "group_consumer_timeout_ms": "5000",  # --consumer-timeout-ms
    "log_level": "warning",
}
UNSYNCED_SETTINGS: dict[str, str] = {"default_flush_policy": "interval"}  # offset_commit_unsynced: fsynced behind
FSYNC_PROBE_BYTES = 120  # about one cursor record's batch
COMMIT_FAN = 6  # offset_commit_6: commits in flight (tidelog: partitions per commit(offsets))

APPROACHES = {
    "tidelog": "tidelog serve (embedded NATS and etcd), flush always; 6-partition stream; 3 GroupConsumer processes "
    "(auto-commit, earliest) iterating records; commits: GroupConsumer.commit of one offset at a time "
    "(SET_CURSOR with the group context, fenced by the broker, acks ALL), six partitions per commit, and "
    "Admin.set_cursor alone; the same commits on a broker with flush interval (unsynced); rebalance: SIGKILL a "
    "member process",
    "jetstream": "nats-server -js, file storage, sync_interval always; one durable pull consumer (explicit acks) "
    "shared by 3 worker processes, fetch batches, ack() each; commits: ack_sync of one message at a time, and of "
    "six at once",
}

MEMBER_READY = 60.0  # seconds for a member process to start and join
BALANCE_WITHIN = 60.0  # seconds for a group to settle (members learn of a new epoch at their next heartbeat)
AUTO_COMMIT_MS = 100  # tidelog members' auto-commit interval: commits happen during the (short) measurement
TRICKLE_EVERY = 0.02  # seconds between rounds of one record per partition while rebalances are measured
ACK_CHECK_WITHIN = 30.0  # seconds for JetStream's ack floor to reach the last message after the workers stop


@dataclass(frozen=True, slots=True)
class Plan:
    runs: int
    messages: int  # pre-filled for group_consume_1k (a multiple of PARTITIONS)
    commits: int  # per offset_commit measurement
    rebalances: int  # member kills per tidelog run
    js_batch: int  # JetStream messages per fetch


QUICK = Plan(runs=2, messages=30_000, commits=500, rebalances=1, js_batch=500)
FULL = Plan(runs=3, messages=120_000, commits=2_000, rebalances=3, js_batch=500)


class Members:
    """The member processes of one measurement and what they reported (see ``benchmarks._group_members``)."""

    def __init__(self, side: str, root: Path) -> None:
        self.side = side
        self.root = root
        self.processes: dict[str, MemberProcess] = {}
        self.assigned: dict[str, set[int]] = {}
        self.consumed = 0
        self.firsts: list[tuple[float, str, int]] = []  # (perf_counter, member, partition)
        self.grants: list[tuple[float, str, int]] = []  # (perf_counter, member, partition): an ``assigned`` event
        self.rebalances = 0
        self._news = asyncio.Event()
        self._count = 0

    def _on_event(self, member: str, event: Event) -> None:
        kind = event["event"]
        if kind == "progress":
            self.consumed += int(event["count"])
        elif kind == "first":
            self.firsts.append((time.perf_counter(), member, int(event["partition"])))
        elif kind == "assigned":
            self.assigned.setdefault(member, set()).update(event["partitions"])
            self.grants += [(time.perf_counter(), member, int(p)) for p in event["partitions"]]
            self.rebalances += 1
        elif kind == "revoked":
            self.assigned.setdefault(member, set()).difference_update(event["partitions"])
        self._news.set()

    async def add(self, count: int, argv: Callable[[str], list[str]]) -> list[MemberProcess]:
        """Start ``count`` members at once; ``argv(name)`` gives each one's arguments."""
        started: list[MemberProcess] = []
        for _ in range(count):
            self._count += 1
            name = f"{self.side}-m{self._count}"
            process = MemberProcess(name, argv(name), self.root / f"{name}.log", self._on_event)
            self.processes[name] = process
            started.append(process)
        await asyncio.gather(*(process.start(MEMBER_READY) for process in started))
        return started

    async def until(self, check: Callable[[], bool], within: float, what: str) -> None:
        """Wait (bounded) until ``check()`` holds, looking again at every event."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while not check():
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"{self.side}: {what} not within {within:g}s (assigned {self.assigned})")
            self._news.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._news.wait(), remaining)

    def balanced(self) -> bool:
        live = [self.assigned.get(name, set()) for name in self.processes]
        every = set().union(*live) if live else set()
        return len(every) == PARTITIONS and all(len(parts) == PARTITIONS // len(live) for parts in live)

    def send(self, command: str) -> None:
        for process in self.processes.values():
            process.send(command)

    async def kill(self, name: str) -> set[int]:
        """SIGKILL one member by PID; return the partitions it held."""
        process = self.processes.pop(name)
        held = self.assigned.pop(name, set())
        await process.kill()
        return held

    async def stop(self) -> None:
        results = await asyncio.gather(*(p.stop() for p in self.processes.values()), return_exceptions=True)
        for name, result in zip(self.processes, results, strict=True):
            if result != 0:
                log(f"  member {name} exited with {result!r}; see {self.root / name}.log")
        self.processes.clear()


class Side(Protocol):
    name: str

    async def consume(self, plan: Plan, payloads: Sequence[bytes], run_no: int) -> float:
        """msg/s: three members consume ``plan.messages`` pre-filled records."""
        ...

    async def commits(self, count: int, run_no: int) -> dict[str, float]:
        """positions/s per commit metric, one commit at a time."""
        ...

    async def rebalances(self, plan: Plan, payload: bytes, run_no: int) -> list[float]:
        """seconds from a member's SIGKILL to its partitions consumed by the others (none where not measured)."""
        ...


# ---- NATS JetStream ----


class JetStreamSide:
    name = "jetstream"

    def __init__(self, server: JetStreamServer, nc: Any, root: Path) -> None:
        self.server = server
        self.nc = nc
        self.js = nc.jetstream(publish_async_max_pending=JS_PUBLISH_WINDOW, timeout=30)
        self.root = root

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, data_dir: Path, settings: Mapping[str, str]) -> AsyncIterator[Side]:
        async with JetStreamServer(data_dir, sync_always=True) as server:
            log(f"jetstream pid {server.pid} on {server.url}")
            nc = await nats.connect(server.url, name="bench-jetstream", pending_size=32 * 1024 * 1024)
            try:
                yield cls(server, nc, data_dir)
            finally:
                await nc.close()

    async def _stream(self, name: str, durable: str) -> None:
        await self.js.add_stream(StreamConfig(name=name, subjects=[name], storage=StorageType.FILE))
        config = ConsumerConfig(durable_name=durable, ack_policy=AckPolicy.EXPLICIT, max_ack_pending=-1)
        await self.js.add_consumer(name, config)

    async def consume(self, plan: Plan, payloads: Sequence[bytes], run_no: int) -> float:
        stream, durable = f"consume{run_no}", f"workers{run_no}"
        await self._stream(stream, durable)
        members = Members(self.name, self.root)

        def argv(name: str) -> list[str]:
            return ["jetstream", "--member", name, "--stream", stream, "--group", durable, "--url", self.server.url,
                    "--batch", str(plan.js_batch)]  # fmt: skip

        try:
            await publish_all(self.js, stream, payloads[: plan.messages], deadline_for(plan.messages))
            await members.add(MEMBERS, argv)
            start = time.perf_counter()
            members.send("go")
            await members.until(lambda: members.consumed >= plan.messages, deadline_for(plan.messages), "consumed")
            elapsed = time.perf_counter() - start
        finally:
            await members.stop()
        if members.consumed != plan.messages:
            log(f"  jetstream: {members.consumed} deliveries of {plan.messages} messages (redeliveries)")

        async def floor() -> bool:
            info = await self.js.consumer_info(stream, durable)
            return int(info.ack_floor.stream_seq) >= plan.messages

        await poll(floor, ACK_CHECK_WITHIN, f"jetstream ack floor of {durable}")
        return plan.messages / elapsed

    async def commits(self, count: int, run_no: int) -> dict[str, float]:
        stream, durable = f"commits{run_no}", f"committer{run_no}"
        await self._stream(stream, durable)
        await publish_all(self.js, stream, make_payloads(16, 2 * count), deadline_for(2 * count))
        sub = await self.js.pull_subscribe(stream, durable=durable, stream=stream)
        messages: list[Any] = []
        while len(messages) < count:  # bounded: every fetch returns at least one message or raises
            messages += await sub.fetch(min(1000, count - len(messages)), timeout=10)
        start = time.perf_counter()
        for message in messages:
            await message.ack_sync(timeout=5)
        rate = count / (time.perf_counter() - start)
        messages = []
        while len(messages) < count:  # bounded as above
            messages += await sub.fetch(min(1000, count - len(messages)), timeout=10)
        rounds = count // COMMIT_FAN
        start = time.perf_counter()
        for i in range(0, rounds * COMMIT_FAN, COMMIT_FAN):
            await asyncio.gather(*(message.ack_sync(timeout=5) for message in messages[i : i + COMMIT_FAN]))
        fan = rounds * COMMIT_FAN / (time.perf_counter() - start)
        await sub.unsubscribe()
        return {"offset_commit": rate, "offset_commit_6": fan}

    async def rebalances(self, plan: Plan, payload: bytes, run_no: int) -> list[float]:
        return []


async def poll(check: Callable[[], Any], within: float, what: str, every: float = 0.05) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await check():
        if loop.time() >= deadline:
            raise TimeoutError(f"{what} not within {within:g}s")
        await asyncio.sleep(every)


# ---- tidelog ----


class GroupServer(TidelogServer):
    """``tidelog serve`` (``benchmarks.publish``) with any broker settings, passed as ``TIDELOG_*`` variables."""

    def __init__(self, data_dir: Path, settings: Mapping[str, str]) -> None:
        super().__init__(data_dir, flush_policy=settings.get("default_flush_policy", "always"))
        self.settings = dict(settings)

    def _env(self) -> dict[str, str]:
        env = super()._env()
        env.update({f"TIDELOG_{key.upper()}": value for key, value in self.settings.items()})
        return env


class TidelogSide:
    name = "tidelog"

    def __init__(self, server: GroupServer, cluster: Cluster, root: Path) -> None:
        self.server = server
        self.cluster = cluster
        self.admin = Admin(cluster=cluster)
        self.root = root
        self.timeout = int(server.settings["group_consumer_timeout_ms"]) / 1000

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, data_dir: Path, settings: Mapping[str, str]) -> AsyncIterator[Side]:
        server = GroupServer(data_dir, settings)
        async with server:
            log(f"tidelog pid {server.pid}, wire port {server.wire_port}")
            cluster = Cluster(server.bootstrap)
            try:
                yield cls(server, cluster, data_dir)
            finally:
                await cluster.close()

    def _producer(self) -> Producer:
        return Producer(cluster=self.cluster, acks=Acks.ALL, compression=Codec.NONE, idempotent=False)

    def _argv(self, stream: str, group: str, per_partition: int = 0) -> Callable[[str], list[str]]:
        """Members of ``group``; with ``per_partition`` (records pre-filled in each partition) they replay them."""
        replay = ["--replay", "--per-partition", str(per_partition)] if per_partition else []

        def argv(name: str) -> list[str]:
            return ["tidelog", "--member", name, "--stream", stream, "--group", group, "--bootstrap",
                    self.server.bootstrap, "--auto-commit-ms", str(AUTO_COMMIT_MS), *replay]  # fmt: skip

        return argv

    async def _fill(self, stream: str, payloads: Sequence[bytes]) -> None:
        producer = self._producer()
        await producer.start()
        try:
            futures = [await producer.send(stream, value, partition=i % PARTITIONS) for i, value in enumerate(payloads)]
            await asyncio.wait_for(producer.flush(), deadline_for(len(payloads)))
        finally:
            await producer.close()
        for future in futures:
            future.result()  # raises if any record was refused

    async def consume(self, plan: Plan, payloads: Sequence[bytes], run_no: int) -> float:
        stream, group = f"consume{run_no}", f"consumers{run_no}"
        per_partition = plan.messages // PARTITIONS
        await self.admin.create_stream(stream, partitions=PARTITIONS)
        members = Members(self.name, self.root)
        try:
            await self._fill(stream, payloads[: plan.messages])
            await members.add(MEMBERS, self._argv(stream, group, per_partition))
            await members.until(members.balanced, BALANCE_WITHIN, "a balanced group")
            settled = members.rebalances
            start = time.perf_counter()
            members.send("go")
            await members.until(lambda: members.consumed >= plan.messages, deadline_for(plan.messages), "consumed")
            elapsed = time.perf_counter() - start
            if members.rebalances != settled or members.consumed != plan.messages:
                log(f"  tidelog: a rebalance during the measurement; {members.consumed} of {plan.messages} counted")
        finally:
            await members.stop()
        offsets = [await self.admin.fetch_cursor(stream, p, group) for p in range(PARTITIONS)]
        if offsets != [per_partition] * PARTITIONS:
            raise RuntimeError(f"tidelog {group}: committed {offsets}, expected {per_partition} in every partition")
        return plan.messages / elapsed

    async def commits(self, count: int, run_no: int) -> dict[str, float]:
        stream = f"commits{run_no}"
        await self.admin.create_stream(stream, partitions=COMMIT_FAN)
        tps = [StreamPartition(stream, p) for p in range(COMMIT_FAN)]
        rates: dict[str, float] = {}
        async with GroupConsumer(
            streams=stream, group_id=f"committer{run_no}", cluster=self.cluster, enable_auto_commit=False
        ) as consumer:
            start = time.perf_counter()
            for offset in range(1, count + 1):
                await consumer.commit({tps[0]: offset})
            rates["offset_commit"] = count / (time.perf_counter() - start)
            rounds = count // COMMIT_FAN
            start = time.perf_counter()
            for offset in range(1, rounds + 1):
                await consumer.commit(dict.fromkeys(tps, offset))
            rates["offset_commit_6"] = rounds * COMMIT_FAN / (time.perf_counter() - start)
        start = time.perf_counter()
        for offset in range(1, count + 1):
            await self.admin.set_cursor(stream, 0, f"cursor{run_no}", offset)
        rates["offset_commit_cursor"] = count / (time.perf_counter() - start)
        return rates

    async def rebalances(self, plan: Plan, payload: bytes, run_no: int) -> list[float]:
        stream, group = f"rebalance{run_no}", f"rebalancing{run_no}"
        await self.admin.create_stream(stream, partitions=PARTITIONS)
        members = Members(self.name, self.root)
        stop = asyncio.Event()
        trickle = asyncio.create_task(self._trickle(stream, payload, stop))
        out: list[float] = []
        try:
            argv = self._argv(stream, group)
            await members.add(MEMBERS, argv)
            members.send("go")
            for sample in range(plan.rebalances):
                if sample:
                    (joined,) = await members.add(1, argv)
                    joined.send("go")
                await members.until(members.balanced, BALANCE_WITHIN, "a balanced group")
                await members.until(lambda: self._reading(members), BALANCE_WITHIN, "every partition read")
                out.append(await self._one_rebalance(members))
                if trickle.done():
                    trickle.result()  # the producer failed: say why
        finally:
            stop.set()
            await members.stop()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(trickle, 30)
        return out

    async def _one_rebalance(self, members: Members) -> float:
        """Kill one member of a balanced, reading group; seconds until the others hand out records of its
        partitions."""
        victim = sorted(members.processes)[0]
        mark, granted = len(members.firsts), len(members.grants)
        start = time.perf_counter()
        moved = await members.kill(victim)

        def taken() -> bool:
            return moved <= {p for _, member, p in members.firsts[mark:] if member != victim}

        await members.until(taken, 4 * self.timeout + 30, f"{victim}'s partitions {sorted(moved)} taken")
        seconds = max(at for at, _, p in members.firsts[mark:] if p in moved) - start
        applied = max((at for at, _, p in members.grants[granted:] if p in moved), default=start) - start
        log(
            f"  tidelog rebalance: killed {victim} holding {sorted(moved)}; the others applied the new assignment "
            f"after {applied:.3f} s and read its partitions after {seconds:.3f} s (timeout {self.timeout:g} s)"
        )
        return seconds

    @staticmethod
    def _reading(members: Members) -> bool:
        """Every member has handed out a record of each partition it holds since it got it."""
        seen = {(member, p) for _, member, p in members.firsts}
        return all((name, p) in seen for name, parts in members.assigned.items() for p in parts)

    async def _trickle(self, stream: str, payload: bytes, stop: asyncio.Event) -> None:
        """One record per partition every ``TRICKLE_EVERY`` seconds until ``stop`` (bounded: about an hour)."""
        producer = self._producer()
        await producer.start()
        try:
            for _ in range(int(3600 / TRICKLE_EVERY)):
                if stop.is_set():
                    return
                futures = [await producer.send(stream, payload, partition=p) for p in range(PARTITIONS)]
                await asyncio.wait_for(asyncio.gather(*futures), 30)
                await asyncio.sleep(TRICKLE_EVERY)
        finally:
            await producer.close()


# ---- the run ----

SideFactory = Callable[[Path, Mapping[str, str]], contextlib.AbstractAsyncContextManager[Side]]
SIDES: dict[str, SideFactory] = {"jetstream": JetStreamSide.open, "tidelog": TidelogSide.open}

Samples = dict[tuple[str, str], list[float]]


async def measure_side(side: Side, plan: Plan, payloads: Sequence[bytes], run_no: int, samples: Samples) -> None:
    rate = await side.consume(plan, payloads, run_no)
    samples[side.name, "group_consume_1k"].append(rate)
    log(f"  {side.name} group_consume_1k: {rate:,.0f} msg/s ({plan.messages} messages, {MEMBERS} members)")
    for metric, value in (await side.commits(plan.commits, run_no)).items():
        samples[side.name, metric].append(value)
        log(f"  {side.name} {metric}: {value:,.0f} positions/s ({plan.commits} one at a time)")
    for seconds in await side.rebalances(plan, payloads[0], run_no):
        samples[side.name, "rebalance_s"].append(seconds)


async def unsynced_commits(plan: Plan, root: Path, settings: Mapping[str, str], run_no: int, samples: Samples) -> None:
    """``offset_commit_unsynced``: ``offset_commit`` on a fresh tidelog broker that fsyncs behind."""
    log(f"run {run_no + 1}/{plan.runs}: tidelog, flush interval (load average {os.getloadavg()[0]:.2f})")
    async with TidelogSide.open(root / f"run{run_no}-tidelog-unsynced", {**settings, **UNSYNCED_SETTINGS}) as side:
        rate = (await side.commits(plan.commits, run_no))["offset_commit"]
    samples["tidelog", "offset_commit_unsynced"].append(rate)
    log(f"  tidelog offset_commit_unsynced: {rate:,.0f} positions/s ({plan.commits} one at a time)")


def fsync_bound(directory: Path, count: int) -> float:
    """fsyncs/s: ``count`` small writes to one file, each followed by ``fdatasync`` (see ``fsync_bound`` above)."""
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        record = os.urandom(FSYNC_PROBE_BYTES)
        start = time.perf_counter()
        for _ in range(count):
            os.write(fd, record)
            os.fdatasync(fd)
        return count / (time.perf_counter() - start)
    finally:
        os.close(fd)
        path.unlink()


async def run(plan: Plan, sides: Sequence[str], root: Path, settings: Mapping[str, str]) -> Samples:
    samples: Samples = defaultdict(list)
    payloads = make_payloads(SIZE, plan.messages)
    for run_no in range(plan.runs):
        # Alternate which side goes first, so drift on a shared machine does not always favour the same one.
        order = list(sides) if run_no % 2 == 0 else list(reversed(sides))
        for name in order:
            log(f"run {run_no + 1}/{plan.runs}: {name} (load average {os.getloadavg()[0]:.2f})")
            async with SIDES[name](root / f"run{run_no}-{name}", settings) as side:
                await measure_side(side, plan, payloads, run_no, samples)
            if name == "tidelog":
                await unsynced_commits(plan, root, settings, run_no, samples)
        bound = fsync_bound(root, plan.commits)
        samples["tidelog", "fsync_bound"].append(bound)
        log(f"  fsync_bound: {bound:,.0f} write+fdatasync/s ({plan.commits} one at a time)")
    return samples


def rows_from(samples: Samples, consumer_timeout: float) -> list[Row]:
    rows: list[Row] = []
    for metric, unit in (("group_consume_1k", "msg/s"), ("offset_commit", "positions/s")):
        ours, theirs = samples.get(("tidelog", metric)), samples.get(("jetstream", metric))
        if ours:
            rows.append(Row(BENCH, metric, median(ours), unit, median(theirs) if theirs else None))
    theirs = samples.get(("jetstream", "offset_commit"))
    for metric, unit in (
        ("offset_commit_cursor", "positions/s"),
        ("offset_commit_unsynced", "positions/s"),
        ("fsync_bound", "fsyncs/s"),
    ):  # informational, beside the same ack_sync
        if ours := samples.get(("tidelog", metric)):
            rows.append(Row(BENCH, metric, median(ours), unit, median(theirs) if theirs else None))
    if fan := samples.get(("tidelog", "offset_commit_6")):
        peer = samples.get(("jetstream", "offset_commit_6"))
        rows.append(Row(BENCH, "offset_commit_6", median(fan), "positions/s", median(peer) if peer else None))
    if rebalance := samples.get(("tidelog", "rebalance_s")):
        rows.append(Row(BENCH, "rebalance_s", median(rebalance), "s", consumer_timeout, digits=3))
    return rows


def parse_settings(pairs: Sequence[str], consumer_timeout_ms: int | None) -> dict[str, str]:
    """``TIDELOG_SETTINGS`` with ``--consumer-timeout-ms`` and each ``--setting key=value`` applied."""
    settings = dict(TIDELOG_SETTINGS)
    if consumer_timeout_ms is not None:
        if consumer_timeout_ms <= 0:
            raise ValueError(f"--consumer-timeout-ms must be positive, got {consumer_timeout_ms}")
        settings["group_consumer_timeout_ms"] = str(consumer_timeout_ms)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--setting expects key=value, got {pair!r}")
        settings[key.strip()] = value.strip()
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.groups", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (a few minutes)")
    parser.add_argument("--runs", type=int, help="runs (fresh servers each); medians are taken over them")
    parser.add_argument("--messages", type=int, help=f"records pre-filled per consume measurement (× {PARTITIONS})")
    parser.add_argument("--rebalances", type=int, help="member kills per tidelog run (0: none)")
    parser.add_argument("--js-batch", type=int, help="JetStream messages per fetch")
    parser.add_argument("--consumer-timeout-ms", type=int, help="tidelog's group_consumer_timeout_ms")
    parser.add_argument(
        "--setting", action="append", default=[], metavar="KEY=VALUE", help="tidelog broker setting (repeatable)"
    )
    parser.add_argument("--sides", default="jetstream,tidelog", help="comma-separated sides (development)")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL
    plan = Plan(
        runs=args.runs or base.runs,
        messages=args.messages or base.messages,
        commits=base.commits,
        rebalances=base.rebalances if args.rebalances is None else args.rebalances,
        js_batch=args.js_batch or base.js_batch,
    )
    if plan.messages % PARTITIONS or plan.messages <= 0:
        parser.error(f"--messages must be a positive multiple of {PARTITIONS} (one share per partition)")
    if plan.js_batch <= 0:
        parser.error("--js-batch must be positive")
    try:
        settings = parse_settings(args.setting, args.consumer_timeout_ms)
    except ValueError as exc:
        parser.error(str(exc))
    sides = [name.strip() for name in args.sides.split(",") if name.strip()]
    if unknown := set(sides) - set(SIDES):
        parser.error(f"unknown sides: {', '.join(sorted(unknown))}")
    timeout = int(settings["group_consumer_timeout_ms"]) / 1000
    log(f"plan: {plan}, sides: {sides}, tidelog settings: {settings}")
    clock = RunClock.now()
    import uvloop

    with scratch_dir("tidelog-bench-groups-") as root:
        samples: Samples = uvloop.run(run(plan, sides, root, settings))
    report(
        BENCH,
        rows_from(samples, timeout),
        TARGETS,
        clock,
        runs=plan.runs,
        messages=plan.messages,
        commits=plan.commits,
        rebalance_samples=len(samples.get(("tidelog", "rebalance_s"), [])),
        consumer_timeout_s=timeout,
        members=MEMBERS,
        partitions=PARTITIONS,
        js_batch=plan.js_batch,
        tidelog_settings=settings,
        approaches=APPROACHES,
        machine=f"{os.cpu_count()} cores, each server and its clients on this one machine, one after the other",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
