"""Expected-offset appends while leaders are killed: the history must be linearizable (issue 5, "Tests").

Several clients race to append to one partition of a 3-broker cluster (replication factor 3, acks ALL), each
append carrying the offset its client believes is the log end (:class:`tidelog.client.Appender`,
``expected_offset``). Meanwhile the partition's leader is killed with SIGKILL and restarted, round after round.
Every append is recorded in a :class:`~tidelog.testing.linearizability.LogHistory` with its answer:

- success → :class:`Ok` at the offset the broker reports;
- INCORRECT_OFFSET → :class:`WrongOffset` with the log end the broker reported (the client continues from it);
- anything else (a timeout, a lost connection, no leader) → :class:`Indeterminate`: it may have landed or not.

At rest the partition is read whole and the history checked: no two successes at one expected offset, each
success exactly where it expected, no acknowledged value lost, no refused value visible, no failure at an offset
the log really ended at. Run it with ``python -m tidelog.testing.cas_faults [--rounds N] [--repeat N]``; the
test suite runs a short version.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tidelog.client import Admin, Appender, Cluster, refusal_details
from tidelog.local.cluster import LocalCluster
from tidelog.protocol.connection import ConnectionClosedError
from tidelog.protocol.errors import IncorrectOffsetError, TidelogError
from tidelog.testing.fault_run import ELECT_WITHIN, READ_WITHIN, REJOIN_WITHIN, SETTINGS
from tidelog.testing.linearizability import (
    Append,
    Indeterminate,
    LinearizabilityReport,
    LogHistory,
    Ok,
    WrongOffset,
)
from tidelog.testing.workload import read_all

log = logging.getLogger(__name__)

STREAM = "cas"
APPEND_TIMEOUT = 5.0  # per append: a client stuck on a dead leader gives up and records Indeterminate


@dataclass(slots=True)
class CasReport:
    """What one run did and whether its history is linearizable."""

    rounds: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    check: LinearizabilityReport | None = None
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures and self.check is not None and self.check.ok

    def __str__(self) -> str:
        verdict = "PASS" if self.ok else "FAIL"
        lines = [f"cas-kill-leader: {verdict} in {self.seconds:.1f}s, {self.rounds} round(s), {dict(self.outcomes)}"]
        lines += [f"  failure: {each}" for each in self.failures]
        if self.check is not None and not self.check.ok:
            lines.append(str(self.check))
        return "\n".join(lines)


async def _client(name: str, bootstrap: list[str], history: LogHistory, stop: asyncio.Event, report: CasReport) -> None:
    """Append unique values, each at the log end this client last learned, until told to stop."""
    cluster = Cluster(bootstrap)
    appender = Appender(cluster=cluster, timeout_ms=int(APPEND_TIMEOUT * 1000))
    guess = 0
    sequence = 0
    try:
        while not stop.is_set():
            sequence += 1
            value = f"{name}-{sequence}".encode()
            op = history.invoke(name, Append(guess, value))
            try:
                async with asyncio.timeout(APPEND_TIMEOUT + 1):
                    outcome = await appender.append(STREAM, 0, [value], expected_offset=guess)
            except IncorrectOffsetError as exc:
                details = refusal_details(exc)
                actual = details.log_end if details is not None and details.log_end >= 0 else None
                history.complete(op, WrongOffset(actual))
                report.outcomes["wrong-offset"] += 1
                if actual is not None:
                    guess = actual
                continue
            except (TidelogError, ConnectionClosedError, TimeoutError, OSError) as exc:
                history.complete(op, Indeterminate(type(exc).__name__))
                report.outcomes["indeterminate"] += 1
                cluster.forget(STREAM)
                await asyncio.sleep(0.05)
                continue
            history.complete(op, Ok(outcome.base_offset))
            report.outcomes["ok"] += 1
            guess = outcome.log_end
    finally:
        await cluster.close()


async def _leader(cluster: LocalCluster) -> str | None:
    record = await cluster.partition_record(STREAM, 0)
    return None if record is None else record.leader


async def _in_isr(cluster: LocalCluster, broker_id: str) -> bool:
    record = await cluster.partition_record(STREAM, 0)
    return record is not None and broker_id in record.isr


async def run_cas_faults(root: Path, *, rounds: int = 1, clients: int = 4, hold: float = 2.0) -> CasReport:
    """One run (see the module docstring); never raises for what the cluster does, only reports it."""
    report = CasReport()
    started = time.monotonic()
    history = LogHistory()
    async with LocalCluster(root, 3, settings=SETTINGS) as cluster:
        async with Admin(cluster.bootstrap()) as admin:
            await admin.create_stream(STREAM, partitions=1, replication_factor=3)
        await cluster.wait_until(lambda: _full_isr(cluster), ELECT_WITHIN, "the stream's ISR to be full")
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(_client(f"c{i}", cluster.bootstrap(), history, stop, report)) for i in range(clients)
        ]
        try:
            await asyncio.sleep(hold)
            for _ in range(rounds):
                victim = await _leader(cluster)
                if victim is None:
                    report.failures.append("the partition had no leader before a round")
                    break
                await cluster.kill(victim)
                await cluster.wait_until(
                    functools.partial(_leader_other_than, cluster, victim), ELECT_WITHIN, "a leader"
                )
                await asyncio.sleep(hold)
                await cluster.restart(victim)
                await cluster.wait_until(functools.partial(_in_isr, cluster, victim), REJOIN_WITHIN, f"{victim} in ISR")
                await asyncio.sleep(hold)
                report.rounds += 1
        except Exception as exc:
            report.failures.append(f"the scenario failed: {exc!r}")
        finally:
            stop.set()
            for result in await asyncio.gather(*tasks, return_exceptions=True):
                if isinstance(result, BaseException):
                    report.failures.append(f"a client crashed: {result!r}")
        try:
            final = await read_all(cluster.bootstrap, STREAM, READ_WITHIN)
        except Exception as exc:
            report.failures.append(f"the final read failed: {exc!r}")
        else:
            history.final_log([value for _, value in final.get(0, [])])
            report.check = history.check()
    report.seconds = time.monotonic() - started
    return report


async def _full_isr(cluster: LocalCluster) -> bool:
    record = await cluster.partition_record(STREAM, 0)
    return record is not None and len(record.isr) == 3 and record.leader is not None


async def _leader_other_than(cluster: LocalCluster, victim: str) -> bool:
    leader = await _leader(cluster)
    return leader is not None and leader != victim


async def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tidelog.testing.cas_faults", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="leader kills per run")
    parser.add_argument("--repeat", type=int, default=1, help="runs, each on a fresh cluster")
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args(argv)
    failed = 0
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="tidelog-cas-") as root:
            report = await run_cas_faults(Path(root), rounds=args.rounds, clients=args.clients)
        print(report, flush=True)
        failed += not report.ok
    return 1 if failed else 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(asyncio.run(_main(sys.argv[1:])))
