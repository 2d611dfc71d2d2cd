"""``tidelog partition reassign`` and ``tidelog broker decommission``: moving replicas between brokers.

Kafka's reassignment tool is the model. A plan is JSON::

    {"version": 1, "partitions": [{"stream": "orders", "partition": 0, "replicas": ["b2", "b3"]}]}

``--generate`` proposes one (the fewest moves that keep the chosen streams' replicas on ``--to-brokers``),
``--execute PLAN`` starts it and prints the current replicas (keep them: they are the plan that moves back) and the
proposed ones, ``--verify PLAN`` shows each partition's progress (``--wait`` until every one is complete, with a
progress bar), ``--cancel PLAN`` undoes the reassignments still under way. ``--execute`` of a plan for a partition
already being reassigned replaces its target (Kafka's rule): the way out when a broker being added died, and
``--cancel`` still restores the replicas it had before the first plan. ``broker decommission B`` plans and
starts the moves that take every replica off B and waits until none is left, then says B is safe to stop.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn

from tidelog.cli.common import async_command, bootstrap, brokers_option, client_tls, output_option
from tidelog.cli.render import print_json, table
from tidelog.client import Admin
from tidelog.protocol.reassign_messages import (
    ListReassignmentsResponse,
    PartitionMove,
    PartitionReplicas,
    ReassignmentStatus,
)

console = Console()

PLAN_VERSION = 1
_POLL = 0.5  # seconds between progress looks while waiting


def read_plan(path: str) -> tuple[PartitionReplicas, ...]:
    """The partitions of a plan file, or a one-line UsageError saying what is wrong with it."""
    try:
        document = json.loads(Path(path).read_text())
    except OSError as exc:
        raise click.UsageError(f"cannot read plan {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise click.UsageError(f"plan {path} is not JSON: {exc.msg} at line {exc.lineno}") from None
    example = '{"version": 1, "partitions": [{"stream": "s", "partition": 0, "replicas": ["b1", "b2"]}]}'
    if not isinstance(document, dict) or not isinstance(document.get("partitions"), list):
        raise click.UsageError(f"plan {path} must be an object with a list of partitions, like {example}")
    if document.get("version", PLAN_VERSION) != PLAN_VERSION:
        raise click.UsageError(f"plan {path} has version {document.get('version')!r}; this tidelog reads version 1")
    out = []
    for i, entry in enumerate(document["partitions"]):
        ok = (
            isinstance(entry, dict)
            and isinstance(entry.get("stream"), str)
            and isinstance(entry.get("partition"), int)
            and entry["partition"] >= 0
            and isinstance(entry.get("replicas"), list)
            and all(isinstance(r, str) and r for r in entry["replicas"])
        )
        if not ok:
            raise click.UsageError(
                f"plan {path}: partitions[{i}] must have a stream (text), a partition (a number from 0) and "
                f"replicas (a list of broker ids), like {example}"
            )
        out.append(PartitionReplicas(entry["stream"], entry["partition"], tuple(entry["replicas"])))
    if not out:
        raise click.UsageError(f"plan {path} names no partition")
    return tuple(out)


def plan_document(entries: Sequence[tuple[str, int, Sequence[str]]]) -> dict[str, object]:
    """A plan as JSON, in the format :func:`read_plan` reads."""
    return {
        "version": PLAN_VERSION,
        "partitions": [{"stream": s, "partition": p, "replicas": list(r)} for s, p, r in entries],
    }


def _both(moves: Sequence[PartitionMove]) -> dict[str, object]:
    return {
        "current": plan_document([(m.stream, m.partition, m.current) for m in moves]),
        "proposed": plan_document([(m.stream, m.partition, m.proposed) for m in moves if not m.note]),
    }


def _moves_table(moves: Sequence[PartitionMove]) -> None:
    rows = table("stream", "partition", "current", "proposed", "note", numeric=("partition",))
    for m in moves:
        rows.add_row(m.stream, str(m.partition), ",".join(m.current), ",".join(m.proposed), m.note)
    console.print(rows)


def _status_table(statuses: Sequence[ReassignmentStatus]) -> None:
    rows = table(
        "stream", "partition", "state", "replicas", "target", "isr", "leader", "detail", numeric=("partition",)
    )
    for s in statuses:
        rows.add_row(
            s.stream,
            str(s.partition),
            s.state,
            ",".join(s.replicas),
            ",".join(s.target),
            ",".join(s.isr),
            s.leader or "-",
            s.detail,
        )
    console.print(rows)


@click.command("reassign")
@click.option("--generate", is_flag=True, help="Propose a plan (printed as JSON) that keeps replicas on --to-brokers.")
@click.option(
    "--execute",
    "execute",
    metavar="PLAN.json",
    help="Start the reassignments of a plan file (a partition already moving elsewhere is re-targeted).",
)
@click.option("--verify", "verify", metavar="PLAN.json", help="Show how far each partition of a plan file is.")
@click.option("--cancel", "cancel", metavar="PLAN.json", help="Undo the reassignments of a plan file still under way.")
@click.option("--to-brokers", default="", help="--generate: the broker ids to place replicas on, comma-separated.")
@click.option("--stream", "streams", multiple=True, help="--generate: only this stream's partitions (repeatable).")
@click.option(
    "--throttle",
    type=click.IntRange(1),
    default=None,
    metavar="BYTES_PER_S",
    help="--execute: cap the bytes per second a leader sends each replica being added.",
)
@click.option("--wait", is_flag=True, help="--verify: wait until every partition is complete (with a progress bar).")
@click.option("--timeout", type=click.FloatRange(1), default=3600.0, show_default=True, help="--wait: give up after.")
@output_option
@brokers_option
@async_command
async def reassign(
    generate: bool,
    execute: str | None,
    verify: str | None,
    cancel: str | None,
    to_brokers: str,
    streams: tuple[str, ...],
    throttle: int | None,
    wait: bool,
    timeout: float,
    output: str,
    brokers: list[str],
) -> None:
    """Move partitions' replicas to other brokers (Kafka's reassignment tool is the model).

    New replicas copy the leader's sealed segments, then fetch, and join the ISR; once every new replica is in
    sync the partition takes its new replicas (leadership moves to the first one if its leader leaves) and the
    brokers it left delete their copy. A partition never goes below min-ISR on the way. Give exactly one of
    --generate, --execute, --verify, --cancel.
    """
    chosen = [name for name, on in (("--generate", generate), ("--execute", execute), ("--verify", verify)) if on]
    chosen += ["--cancel"] if cancel else []
    if len(chosen) != 1:
        raise click.UsageError(
            "give exactly one of --generate, --execute PLAN.json, --verify PLAN.json, --cancel PLAN.json"
        )
    if throttle is not None and not execute:
        raise click.UsageError("--throttle goes with --execute")
    if (to_brokers or streams) and not generate:
        raise click.UsageError("--to-brokers and --stream go with --generate")
    targets = [b.strip() for b in to_brokers.split(",") if b.strip()]
    if generate and not targets:
        raise click.UsageError("--generate needs --to-brokers b1,b2,... (the brokers to keep replicas on)")
    plan = read_plan(execute or verify or cancel or "") if not generate else ()
    async with Admin(bootstrap(brokers), ssl=client_tls()) as admin:
        if generate:
            answer = await admin.reassign_partitions(generate_for=targets, streams=streams)
            if output == "json" or not answer.moves:
                print_json(_both(answer.moves))
            else:
                _moves_table(answer.moves)
                console.print("proposed plan (save it and pass it to --execute):")
                print_json(plan_document([(m.stream, m.partition, m.proposed) for m in answer.moves if not m.note]))
            return
        if execute:
            answer = await admin.reassign_partitions(plan, throttle_bps=throttle or 0)
            print_json(_both(answer.moves))  # JSON for people too: "current" is the plan that moves back
            return
        if cancel:
            answer = await admin.reassign_partitions(plan, cancel=True)
            if output == "json":
                print_json(_both(answer.moves))
            else:
                _moves_table(answer.moves)
            return
        statuses = (await admin.list_reassignments(plan)).statuses
        if wait:
            statuses = await _wait(admin, plan, timeout, output)
        if output == "json":
            print_json({"partitions": statuses})
        else:
            _status_table(statuses)
        if wait and any(s.state != "complete" for s in statuses):
            raise click.ClickException(f"not every partition was complete after {timeout:.0f}s")


async def _wait(
    admin: Admin, plan: tuple[PartitionReplicas, ...], timeout: float, output: str
) -> tuple[ReassignmentStatus, ...]:
    deadline = time.monotonic() + timeout
    with Progress(
        TextColumn("reassigning"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} partitions"),
        console=console,
        disable=output == "json" or not console.is_terminal,
        transient=True,
    ) as bar:
        task = bar.add_task("reassign", total=len(plan))
        while True:
            statuses = (await admin.list_reassignments(plan)).statuses
            done = sum(1 for s in statuses if s.state == "complete")
            bar.update(task, completed=done)
            if done == len(statuses) or time.monotonic() >= deadline:
                return statuses
            await asyncio.sleep(_POLL)


@click.group("broker")
def broker() -> None:
    """Manage brokers: take one out of the cluster."""


@click.command("decommission")
@click.argument("broker_id")
@click.option(
    "--throttle",
    type=click.IntRange(1),
    default=None,
    metavar="BYTES_PER_S",
    help="Cap the bytes per second a leader sends each replica being added.",
)
@click.option("--no-wait", is_flag=True, help="Start the moves and return; follow with --verify or run this again.")
@click.option("--timeout", type=click.FloatRange(1), default=3600.0, show_default=True, help="Give up waiting after.")
@output_option
@brokers_option
@async_command
async def decommission(
    broker_id: str, throttle: int | None, no_wait: bool, timeout: float, output: str, brokers: list[str]
) -> None:
    """Move every replica off broker BROKER_ID, then say it is safe to stop.

    Each partition on it moves one replica (the fewest moves), to a broker chosen rack-aware and least loaded,
    as a reassignment: the new replica catches up and joins the ISR before the one on BROKER_ID is dropped. A
    partition below min-ISR, or one whose new replica cannot catch up, waits, and the progress says so. Running
    it again goes on where it left off.
    """
    async with Admin(bootstrap(brokers), ssl=client_tls()) as admin:
        answer = await admin.decommission_broker(broker_id, throttle_bps=throttle or 0)
        if output != "json" and answer.moves:
            _moves_table(answer.moves)
        left = await admin.list_reassignments(broker_id=broker_id)
        if not no_wait and left.replicas_on:
            left = await _drain(admin, broker_id, left.replicas_on, timeout, output)
    safe = left.replicas_on == 0
    if output == "json":
        print_json(
            {
                "broker": broker_id,
                "moves": answer.moves,
                "replicas_left": left.replicas_on,
                "safe_to_stop": safe,
                "partitions": left.statuses,
            }
        )
    elif safe:
        console.print(f"broker [bold]{broker_id}[/] holds no replica: it is safe to stop")
    else:
        _status_table(left.statuses)
        console.print(f"broker [bold]{broker_id}[/] still holds {left.replicas_on} replica(s): not safe to stop yet")
    if not safe and not no_wait:
        raise click.ClickException(f"broker {broker_id} still holds {left.replicas_on} replica(s) after {timeout:.0f}s")


async def _drain(admin: Admin, broker_id: str, total: int, timeout: float, output: str) -> ListReassignmentsResponse:
    deadline = time.monotonic() + timeout
    with Progress(
        TextColumn(f"moving replicas off {broker_id}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.description}"),
        console=console,
        disable=output == "json" or not console.is_terminal,
        transient=True,
    ) as bar:
        task = bar.add_task("", total=total)
        while True:
            left = await admin.list_reassignments(broker_id=broker_id)
            waiting = [s for s in left.statuses if s.state == "waiting"]
            note = f"waiting: {waiting[0].stream}/{waiting[0].partition}: {waiting[0].detail}" if waiting else ""
            bar.update(task, completed=total - left.replicas_on, description=note)
            if left.replicas_on == 0 or time.monotonic() >= deadline:
                return left
            await asyncio.sleep(_POLL)


broker.add_command(decommission)
