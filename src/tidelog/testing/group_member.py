"""A consumer group member in a process of its own, for the group fault scenario (:mod:`tidelog.testing.group_faults`)
to SIGKILL and start again at random.

``python -m tidelog.testing.group_member EVENTS BOOTSTRAP STREAM GROUP CONSUMER_ID [--commit-every N]`` runs a
:class:`~tidelog.client.GroupConsumer` (``auto_offset_reset="earliest"``, explicit commits) and appends what it
does to the file ``EVENTS``, one JSON object a line, each written and flushed before the member goes on, so a
SIGKILL loses no event the member acted on::

    {"ev": "ready"}                               joined: the consumer has started
    {"ev": "assigned", "p": [0, 2]}               on_assigned (partitions of STREAM)
    {"ev": "revoked", "p": [2]}                   on_revoked
    {"ev": "rec", "p": 0, "o": 17, "v": "p-93"}   a record handed out (consumed), with its value
    {"ev": "commit", "p": 0, "o": 18}             a commit acknowledged: the group's offset of p is now 18

It commits each partition it holds (its position: the next offset to hand out) every ``--commit-every`` records
and whenever no record came for a moment, partition by partition, so each ``commit`` event names exactly what was
acknowledged. A commit refused because the partition moved (or that fails with a broker down) is not an event; it
is written to stderr. SIGTERM ends it cleanly: commit, ``on_revoked``, leave.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Callable
from typing import IO, Any

from tidelog.client import GroupConsumer
from tidelog.client.group_membership import StreamPartition
from tidelog.protocol.errors import TidelogError

IDLE = 0.2
"""Seconds without a record after which the member commits what it holds."""
JOIN_ATTEMPTS = 60
JOIN_BACKOFF = 0.5


class Events:
    """The member's event file: one JSON object a line, flushed each time."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out

    def emit(self, **event: Any) -> None:
        self._out.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._out.flush()


async def commit_all(consumer: GroupConsumer, events: Events) -> None:
    """Commit every partition held, one at a time, and note each acknowledged commit."""
    for tp in sorted(consumer.assignment()):
        try:
            position = consumer.position(tp)
        except ValueError:
            continue  # revoked meanwhile
        if position < 0:
            continue
        try:
            await consumer.commit({tp: position})
        except (TidelogError, ValueError) as exc:
            print(f"commit of {tp.stream}/{tp.partition} at {position} not made: {exc!r}", file=sys.stderr, flush=True)
            continue
        events.emit(ev="commit", p=tp.partition, o=position)


async def join(member: Callable[[], GroupConsumer]) -> GroupConsumer:
    """A started member; joining is tried again while it fails (a broker of the cluster may be down just then)."""
    failure: Exception | None = None
    for _ in range(JOIN_ATTEMPTS):
        consumer = member()
        try:
            await consumer.start()
            return consumer
        except TidelogError as exc:
            failure = exc
            print(f"join failed: {exc!r}; trying again", file=sys.stderr, flush=True)
            with contextlib.suppress(Exception):
                await consumer.close()
            await asyncio.sleep(JOIN_BACKOFF)
    raise RuntimeError(f"could not join in {JOIN_ATTEMPTS} attempts") from failure


async def run(events: Events, bootstrap: list[str], stream: str, group: str, consumer_id: str, every: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    def assigned(partitions: frozenset[StreamPartition]) -> None:
        events.emit(ev="assigned", p=sorted(tp.partition for tp in partitions))

    def revoked(partitions: frozenset[StreamPartition]) -> None:
        events.emit(ev="revoked", p=sorted(tp.partition for tp in partitions))

    def member() -> GroupConsumer:
        return GroupConsumer(
            bootstrap,
            stream,
            group_id=group,
            consumer_id=consumer_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            on_assigned=assigned,
            on_revoked=revoked,
        )

    consumer = await join(member)
    async with consumer:
        events.emit(ev="ready")
        handed = 0
        while not stop.is_set():
            record = await consumer.getone(timeout=IDLE)
            if record is not None:
                value = record.value.decode(errors="replace") if record.value is not None else ""
                events.emit(ev="rec", p=record.partition, o=record.offset, v=value)
                handed += 1
            if handed >= every or (record is None and handed):
                await commit_all(consumer, events)
                handed = 0
        await commit_all(consumer, events)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m tidelog.testing.group_member", description=__doc__.split("\n")[0])
    parser.add_argument("events")
    parser.add_argument("bootstrap", help="comma-separated host:port of brokers' wire listeners")
    parser.add_argument("stream")
    parser.add_argument("group")
    parser.add_argument("consumer_id")
    parser.add_argument("--commit-every", type=int, default=20)
    args = parser.parse_args(argv)
    with open(args.events, "a", encoding="utf-8") as out:
        bootstrap = [a for a in args.bootstrap.split(",") if a]
        asyncio.run(run(Events(out), bootstrap, args.stream, args.group, args.consumer_id, args.commit_every))


if __name__ == "__main__":
    main(sys.argv[1:])
