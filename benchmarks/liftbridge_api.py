"""Liftbridge gRPC API benchmark: tidelog's ``proto.API`` against a bare servicer of the same API, in the same run.

Run: ``.venv/bin/python -m benchmarks.liftbridge_api [--quick]``. It measures the server, not the client: the
load comes from several client processes (:mod:`benchmarks._liftbridge_load`, ``--clients`` of them, each a
``grpc.aio`` client on uvloop passing bytes through unparsed), so no one client's GIL bounds the rate. The two
servers run one after the other, each as its own process, stopped by PID afterwards:

- tidelog: ``tidelog serve`` (a single broker with its embedded NATS and etcd, ``default_flush_policy``
  ``--flush-policy``, ``always`` by default: fsync before the ack).
- the peer: :mod:`benchmarks._bare_liftbridge`, a ``proto.API`` servicer on stock ``grpc.aio`` + uvloop that
  stores and reads nothing (the serving stack's floor per message).

Metrics (``ratio`` = tidelog ÷ bare; every client process moves ``COUNT`` messages; 100-byte values):

- ``subscribe_catchup_msgs`` msg/s: every client subscribes from the earliest offset of a partition holding
  ``COUNT`` messages and reads them all (the bare servicer streams the same number of pre-built messages).
- ``subscribe_tail_msgs`` msg/s: every client subscribes to new messages only; once all are subscribed, this
  process produces ``COUNT`` messages with tidelog's own batching producer and every client reads them. The bare
  servicer has nothing to tail: its number is the same stream of pre-built messages.
- ``publish_async_leader_msgs``, ``publish_async_all_msgs`` msg/s: every client sends ``COUNT`` ``PublishAsync``
  requests with ack policy LEADER (resp. ALL) and at most ``--window`` of them unacknowledged, and reads every
  ack; a response carrying an ``asyncError`` is counted as a failure and fails the run.
- ``*_cpu_us`` µs of server CPU per message (user + system time of the server process from
  ``/proc/<pid>/stat``, all its threads, over the measured phase; tidelog's embedded NATS and etcd are other
  processes and not counted). Ratio ≤ 1 is better.
- ``gufo_subscribe_msgs``, ``gufo_publish_async_msgs`` msg/s: the same catch-up and LEADER publish with
  ``gufo-liftbridge`` (``subscribe``, ``publish_bulk``), a Python client written by others and itself the bottleneck:
  the target is that tidelog keeps what it reaches against the bare servicer.

With ``--fronts N`` (informational rows, no target): every measurement also against ``tidelog serve`` with
``api_front_processes`` N (:mod:`tidelog.api.front`), rows ``fronts<N>_*`` beside the same bare servicer; the CPU
is the broker's and its fronts' together.

With ``--stacks`` (informational rows, no target): the bare servicer's catch-up ``Subscribe`` and LEADER
``PublishAsync`` on other serving stacks, each against the peer (stock ``grpc.aio`` + uvloop) of the same run:
``stack_aio_asyncio_*`` (``grpc.aio`` on the default loop), ``stack_sync_*`` (``grpc.server``, thread pool),
``stack_grpclib_*`` (``grpclib`` on uvloop), and ``stack_aio_uvloop_x2_*``, ``stack_sync_x2_*``,
``stack_grpclib_x2_*`` (two processes sharing the port with SO_REUSEPORT; the CPU is both processes').

Each value is the median over the runs (sides alternate which goes first). The last line is the summary with the
targets. The machine's load average at the start and end is in the summary: a busy machine gives noisy numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks._bare_liftbridge import SERVING, STACKS
from benchmarks._common import Row, RunClock, Target, log, median, report, scratch_dir
from benchmarks._publish_sides import TidelogServer, make_payloads
from tidelog.client import Acks, Admin, Cluster, Producer
from tidelog.launch.ports import free_ports
from tidelog.launch.probes import ReadinessProbe, all_of, tcp_probe
from tidelog.launch.process import ManagedProcess

BENCH = "liftbridge_api"
STREAM = "bench"
VALUE_BYTES = 100
LEADER, ALL = 0, 1  # AckPolicy numbers
ROOT = Path(__file__).resolve().parents[1]
TARGETS = (
    Target("subscribe_catchup_msgs", ">=", 1.5),
    Target("subscribe_tail_msgs", ">=", 1.5),
    Target("publish_async_leader_msgs", ">=", 1.2),
    Target("publish_async_all_msgs", ">=", 1.2),
    Target("gufo_subscribe_msgs", ">=", 0.9),
    Target("gufo_publish_async_msgs", ">=", 0.9),
)
THROUGHPUT = [target.metric for target in TARGETS]
CPU = [m.replace("_msgs", "_cpu_us") for m in THROUGHPUT if not m.startswith("gufo_")]
APPROACHES = {
    "load": "separate client processes (grpc.aio on uvloop, bytes unparsed; or gufo-liftbridge), started before "
    "and released together; msg/s = all messages / (last client done - first client started)",
    "tidelog": "tidelog serve, single broker, embedded NATS and etcd",
    "bare": "benchmarks._bare_liftbridge: proto.API on stock grpc.aio + uvloop doing nothing",
}


@dataclass(frozen=True, slots=True)
class Plan:
    runs: int
    clients: int
    count: int  # messages per client process and measurement
    gufo_count: int
    window: int


QUICK = Plan(runs=1, clients=2, count=2_000, gufo_count=1_000, window=512)
FULL = Plan(runs=3, clients=4, count=50_000, gufo_count=20_000, window=1024)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` (all its threads), from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Measured:
    msgs_per_s: float
    cpu_us: float


class Server:
    """One side: where its gRPC port is, its server process, and how to put messages into its stream."""

    def __init__(self, name: str, address: str, pids: list[int], tidelog: TidelogServer | None) -> None:
        self.name = name
        self.address = address
        self.pids = pids  # the server's processes: its CPU is theirs together
        self.tidelog = tidelog

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids)


def children_of(pid: int) -> list[int]:
    """The child processes of ``pid`` (its API fronts, its embedded NATS and etcd), from ``/proc``."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = (task / "children").read_text().split()
        found += [int(child) for child in children]
    return found


def is_front(pid: int) -> bool:
    return b"tidelog.api.front" in Path(f"/proc/{pid}/cmdline").read_bytes()


@asynccontextmanager
async def tidelog_server(root: Path, flush_policy: str, fronts: int = 0) -> AsyncIterator[Server]:
    name = f"fronts{fronts}" if fronts else "tidelog"
    async with TidelogServer(root / name, flush_policy=flush_policy, metrics=False, fronts=fronts) as server:
        assert server.pid is not None
        admin = Admin(cluster=Cluster(server.bootstrap))
        await admin.create_stream(STREAM, STREAM)
        pids = [server.pid, *(child for child in children_of(server.pid) if is_front(child))]
        if len(pids) != fronts + 1:
            raise RuntimeError(f"expected {fronts} API fronts under broker pid {server.pid}, found {pids[1:]}")
        yield Server(name, f"127.0.0.1:{server.grpc_port}", pids, server)


@asynccontextmanager
async def bare_server(root: Path, stack: str = "aio-uvloop", processes: int = 1) -> AsyncIterator[Server]:
    """The bare servicer on ``stack``; with several ``processes``, all on one port (SO_REUSEPORT)."""
    (port,) = free_ports(1, "127.0.0.1")
    argv = [sys.executable, "-m", "benchmarks._bare_liftbridge", "--port", str(port), "--stream", STREAM]
    argv += ["--value-bytes", str(VALUE_BYTES), "--stack", stack]
    if processes > 1:
        argv.append("--reuseport")
    await asyncio.to_thread(root.mkdir, parents=True, exist_ok=True)
    started: list[ManagedProcess] = []
    try:
        for index in range(processes):
            log_path = root / f"bare-{index}.log"
            process = ManagedProcess(argv, log_path=log_path, name="bare-liftbridge", cwd=ROOT)
            started.append(process)
            await process.start(all_of(tcp_probe("127.0.0.1", port), printed(log_path, SERVING)), ready_within=60)
        pids = [process.pid for process in started if process.pid is not None]
        name = "bare" if (stack, processes) == (STACKS[0], 1) else stack_label(stack, processes)
        yield Server(name, f"127.0.0.1:{port}", pids, None)
    finally:
        for process in started:
            await process.stop(grace=10)


OTHER_STACKS = (("aio-asyncio", 1), ("sync", 1), ("grpclib", 1), ("aio-uvloop", 2), ("sync", 2), ("grpclib", 2))
"""The serving stacks ``--stacks`` measures beside the peer (stack, processes sharing the port)."""
STACK_STEPS = ("subscribe_catchup", "publish_async_leader")


def stack_label(stack: str, processes: int) -> str:
    label = stack.replace("-", "_")
    return label if processes == 1 else f"{label}_x{processes}"


def printed(path: Path, line: str) -> ReadinessProbe:
    """Ready once the process logging to ``path`` has printed ``line``."""

    def seen() -> bool:
        return path.exists() and line in path.read_text(errors="replace").splitlines()

    async def probe() -> bool:
        return await asyncio.to_thread(seen)

    return probe


async def produce(server: TidelogServer, count: int) -> None:
    """``count`` messages into the stream with tidelog's own batching producer, every one acknowledged."""
    producer = Producer(cluster=Cluster(server.bootstrap), acks=Acks.LEADER, idempotent=False)
    await producer.start()
    try:
        for payload in make_payloads(VALUE_BYTES, count):
            await producer.send(STREAM, payload)
        await asyncio.wait_for(producer.flush(), max(60.0, count / 200))
    finally:
        await producer.close()


async def measure(server: Server, kind: str, rpc: str, plan: Plan, count: int, ack_policy: int = LEADER) -> Measured:
    """One measurement: ``plan.clients`` load processes released together against ``server``."""
    argv = ["-m", "benchmarks._liftbridge_load", kind, rpc, server.address, STREAM, str(count)]
    argv += ["--value-bytes", str(VALUE_BYTES), "--ack-policy", str(ack_policy), "--window", str(plan.window)]
    bound = max(120.0, count * plan.clients / 100)
    clients = [
        await asyncio.create_subprocess_exec(
            sys.executable, *argv, cwd=ROOT, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        for _ in range(plan.clients)
    ]
    try:
        for client in clients:
            assert client.stdout is not None
            line = await asyncio.wait_for(client.stdout.readline(), 120)
            if line.strip() != b"ready":
                raise RuntimeError(f"{kind} {rpc} client against {server.name} did not start: {line!r}")
        cpu_before = server.cpu_seconds()
        for client in clients:
            assert client.stdin is not None
            client.stdin.write(b"go\n")
            await client.stdin.drain()
        if rpc == "tail" and server.tidelog is not None:
            await produce(server.tidelog, count)
        results = []
        for client in clients:
            out, _ = await asyncio.wait_for(client.communicate(), bound)
            results.append(json.loads(out.decode().strip().splitlines()[-1]))
        cpu = server.cpu_seconds() - cpu_before
    finally:
        for client in clients:
            if client.returncode is None:
                client.kill()  # by its PID
                await client.wait()
    errors = sum(r["errors"] for r in results)
    if errors:
        raise RuntimeError(f"{kind} {rpc} against {server.name}: {errors} messages failed or missing")
    total = sum(r["count"] for r in results)
    elapsed = max(r["ended"] for r in results) - min(r["started"] for r in results)
    return Measured(total / elapsed, cpu / total * 1e6)


async def run_side(
    server: Server, plan: Plan, samples: dict[str, list[float]], only: Sequence[str] | None = None
) -> None:
    """Every measurement (those named in ``only``, when given) against ``server``."""
    side = server.name
    if server.tidelog is not None:
        await produce(server.tidelog, plan.count)  # what the catch-up reads
    steps: list[tuple[str, str, str, int, int]] = [
        ("subscribe_catchup", "raw", "catchup", plan.count, LEADER),
        ("subscribe_tail", "raw", "tail", plan.count, LEADER),
        ("publish_async_leader", "raw", "publish", plan.count, LEADER),
        ("publish_async_all", "raw", "publish", plan.count, ALL),
        ("gufo_subscribe", "gufo", "catchup", plan.gufo_count, LEADER),
        ("gufo_publish_async", "gufo", "publish", plan.gufo_count, LEADER),
    ]
    for name, kind, rpc, count, policy in steps:
        if only is not None and name not in only:
            continue
        got = await measure(server, kind, rpc, plan, count, policy)
        samples[f"{side}:{name}_msgs"].append(got.msgs_per_s)
        samples[f"{side}:{name}_cpu_us"].append(got.cpu_us)
        log(f"{side} {name}: {got.msgs_per_s:,.0f} msg/s, {got.cpu_us:.1f} µs server CPU per message")


async def run(plan: Plan, flush_policy: str, stacks: bool, fronts: int = 0) -> list[Row]:
    samples: dict[str, list[float]] = defaultdict(list)
    with scratch_dir("tidelog-bench-lbapi-") as root:
        for index in range(plan.runs):
            order = ("tidelog", "bare") if index % 2 == 0 else ("bare", "tidelog")
            for side in order:
                where = root / f"run{index}"
                if side == "tidelog":
                    async with tidelog_server(where, flush_policy) as server:
                        await run_side(server, plan, samples)
                else:
                    async with bare_server(where) as server:
                        await run_side(server, plan, samples)
            if fronts:
                async with tidelog_server(root / f"run{index}", flush_policy, fronts) as server:
                    await run_side(server, plan, samples)
            for stack, processes in OTHER_STACKS if stacks else ():
                async with bare_server(root / f"run{index}", stack, processes) as server:
                    await run_side(server, plan, samples, STACK_STEPS)
    rows = [Row(BENCH, m, median(samples[f"tidelog:{m}"]), "msg/s", median(samples[f"bare:{m}"])) for m in THROUGHPUT]
    rows += [Row(BENCH, m, median(samples[f"tidelog:{m}"]), "us", median(samples[f"bare:{m}"])) for m in CPU]
    if fronts:
        side = f"fronts{fronts}"
        rows += [
            Row(BENCH, f"{side}_{m}", median(samples[f"{side}:{m}"]), unit, median(samples[f"bare:{m}"]))
            for metrics, unit in ((THROUGHPUT, "msg/s"), (CPU, "us"))
            for m in metrics
        ]
    for stack, processes in OTHER_STACKS if stacks else ():
        label = stack_label(stack, processes)
        for step in STACK_STEPS:
            for metric, unit in ((f"{step}_msgs", "msg/s"), (f"{step}_cpu_us", "us")):
                value = median(samples[f"{label}:{metric}"])
                rows.append(Row(BENCH, f"stack_{label}_{metric}", value, unit, median(samples[f"bare:{metric}"])))
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one short run, to check that the benchmark works")
    parser.add_argument("--clients", type=int, help="load-generating client processes (default: 2 quick, 4 full)")
    parser.add_argument("--runs", type=int, help="runs per side (the median is reported)")
    parser.add_argument("--flush-policy", choices=("always", "interval", "never"), default="always")
    parser.add_argument(
        "--stacks",
        action="store_true",
        help="also serve the bare servicer on other stacks (informational rows stack_*, peer: grpc.aio + uvloop)",
    )
    parser.add_argument(
        "--fronts",
        type=int,
        default=0,
        metavar="N",
        help="also measure tidelog with N API front processes (informational rows fronts<N>_*, peer: bare)",
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.clients is not None or args.runs is not None:
        plan = Plan(args.runs or plan.runs, args.clients or plan.clients, plan.count, plan.gufo_count, plan.window)
    if plan.clients < 1 or plan.runs < 1:
        parser.error("--clients and --runs must be at least 1")
    if args.fronts < 0:
        parser.error("--fronts must not be negative")
    clock = RunClock.now()
    rows = asyncio.run(run(plan, args.flush_policy, args.stacks, args.fronts))
    report(BENCH, rows, TARGETS, clock, approaches=APPROACHES, flush_policy=args.flush_policy, plan=vars_of(plan))


def vars_of(plan: Plan) -> dict[str, int]:
    return {"runs": plan.runs, "clients": plan.clients, "count": plan.count, "gufo_count": plan.gufo_count}


if __name__ == "__main__":
    main()
