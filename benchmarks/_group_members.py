"""The members of the groups benchmark: one process each, driven by its parent over stdin and stdout.

``python -m benchmarks._group_members tidelog|jetstream ...`` runs one member: a tidelog
:class:`~tidelog.client.GroupConsumer` (auto-commit) or a JetStream worker pulling from one durable consumer
with explicit acks (nats-py ``pull_subscribe``, ``fetch`` of ``--batch`` messages, ``ack()`` each). Each member is
its own process (its own interpreter and GIL), as the members of a real group are, on both sides alike.

The line protocol. The parent writes commands on the member's stdin, one per line: ``go`` (consume) and ``stop``
(close: a tidelog member commits and leaves the group; then exit). End of input stops a member too, so it never
outlives a parent that died. A member starts in the ``forming`` state: a tidelog member iterates already, with a
2 ms timeout (rebalances are applied, and a ``go`` is acted on at once); a JetStream worker waits for ``go``.
With ``--replay`` a tidelog member starts at the log end (``auto_offset_reset="latest"``: its readers have nothing
to fetch ahead) and on ``go`` seeks each of its partitions to offset 0, so every pre-filled record is read after
``go``.

Events go to stdout, one JSON object per line: ``ready``; ``assigned`` / ``revoked`` (tidelog: partitions, from
the rebalance callbacks); ``first`` (tidelog: the first record handed out from a partition since it was
assigned); ``progress`` (records consumed since the last report: every ``REPORT_EVERY`` records, at the last
record of a pre-filled partition, after every JetStream fetch, and whenever the member is idle); ``closed``.
Logs go to stderr.

:class:`MemberProcess` is the parent's side: it starts a member, sends commands, hands its events to a
callback, and stops it by PID (SIGKILL for the rebalance measurement).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import nats
from nats.errors import TimeoutError as NatsTimeoutError

from tidelog.client import GroupConsumer, StreamPartition

REPORT_EVERY = 1000  # records between progress events
IDLE_WAIT = 0.05  # seconds a member waits for a record before it reports and looks at its commands again
FORMING_WAIT = 0.002  # the same before ``go``: the wait for ``go`` must not delay the start (tidelog only)
STOP_WITHIN = 30.0  # seconds a member has to close after ``stop`` before it is killed
_ROOT = Path(__file__).resolve().parents[1]  # the members run as ``-m benchmarks._group_members`` from here

Event = dict[str, Any]


# ---- the member's side ----


class Commands:
    """The parent's last command, read from stdin by a background task."""

    def __init__(self) -> None:
        self.state = "forming"
        self.changed = asyncio.Event()

    async def read(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while True:
            line = (await reader.readline()).decode().strip()
            self.state = "go" if line == "go" else "stop"  # end of input stops the member
            self.changed.set()
            if self.state == "stop":
                return

    async def next_change(self) -> None:
        self.changed.clear()
        await self.changed.wait()


def tell(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


class Progress:
    """Records consumed since the last report."""

    def __init__(self) -> None:
        self.pending = 0

    def add(self, count: int) -> None:
        self.pending += count
        if self.pending >= REPORT_EVERY:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            tell("progress", count=self.pending)
            self.pending = 0


async def tidelog_member(args: argparse.Namespace, commands: Commands) -> None:
    fresh: set[StreamPartition] = set()  # assigned, no record handed out from it yet

    def assigned(partitions: frozenset[StreamPartition]) -> None:
        fresh.update(partitions)
        tell("assigned", partitions=sorted(tp.partition for tp in partitions))

    def revoked(partitions: frozenset[StreamPartition]) -> None:
        fresh.difference_update(partitions)
        tell("revoked", partitions=sorted(tp.partition for tp in partitions))

    progress = Progress()
    consumer = GroupConsumer(
        args.bootstrap,
        args.stream,
        group_id=args.group,
        consumer_id=args.member,
        auto_offset_reset="latest" if args.replay else "earliest",
        auto_commit_interval_ms=args.auto_commit_ms,
        on_assigned=assigned,
        on_revoked=revoked,
    )
    async with consumer:
        tell("ready")
        replay = args.replay
        while commands.state != "stop":
            if replay and commands.state == "go":
                replay = False
                for tp in consumer.assignment():
                    consumer.seek(tp, 0)
            record = await consumer.getone(timeout=IDLE_WAIT if commands.state == "go" else FORMING_WAIT)
            if record is None:
                progress.flush()
                continue
            tp = StreamPartition(record.stream, record.partition)
            if tp in fresh:
                fresh.discard(tp)
                tell("first", partition=record.partition)
            progress.add(1)
            if record.offset + 1 == args.per_partition:
                progress.flush()  # the last pre-filled record of this partition: report at once
        progress.flush()
    tell("closed")


async def jetstream_member(args: argparse.Namespace, commands: Commands) -> None:
    progress = Progress()
    nc = await nats.connect(args.url, name=f"bench-{args.member}", pending_size=32 * 1024 * 1024)
    try:
        js = nc.jetstream(timeout=30)
        sub = await js.pull_subscribe(args.stream, durable=args.group, stream=args.stream)
        tell("ready")
        while commands.state != "stop":
            if commands.state != "go":
                await commands.next_change()
                continue
            try:
                messages = await sub.fetch(args.batch, timeout=IDLE_WAIT * 4)
            except NatsTimeoutError:
                progress.flush()
                continue
            for message in messages:
                await message.ack()
            progress.add(len(messages))
            progress.flush()  # one report per fetched batch
        await nc.flush(timeout=10)  # the last acks are sent
    finally:
        await nc.close()
    tell("closed")


MEMBERS = {"tidelog": tidelog_member, "jetstream": jetstream_member}


async def member_main(args: argparse.Namespace) -> None:
    commands = Commands()
    reading = asyncio.create_task(commands.read())
    try:
        await MEMBERS[args.side](args, commands)
    finally:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks._group_members", description=__doc__.split("\n")[0])
    parser.add_argument("side", choices=sorted(MEMBERS))
    parser.add_argument("--member", required=True, help="consumer id (tidelog) or connection name (jetstream)")
    parser.add_argument("--stream", required=True)
    parser.add_argument("--group", required=True, help="group id (tidelog) or durable consumer name (jetstream)")
    parser.add_argument("--bootstrap", default="", help="tidelog: the broker's wire address")
    parser.add_argument("--url", default="", help="jetstream: the server's URL")
    parser.add_argument("--replay", action="store_true", help="tidelog: start at the end, seek to 0 on go")
    parser.add_argument("--per-partition", type=int, default=0, help="tidelog: records pre-filled per partition")
    parser.add_argument("--auto-commit-ms", type=int, default=5000, help="tidelog: auto-commit interval")
    parser.add_argument("--batch", type=int, default=500, help="jetstream: messages per fetch")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    import uvloop

    uvloop.run(member_main(args))
    return 0


# ---- the parent's side ----


class MemberProcess:
    """One member process: started with pipes, its events handed to ``on_event(member, event)``; stopped by PID."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, on_event: Callable[[str, Event], None]) -> None:
        self.name = name
        self._argv = list(argv)
        self._log_path = log_path
        self._on_event = on_event
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        self.closed = asyncio.Event()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def start(self, within: float) -> None:
        """Start the member and wait (bounded) for its ``ready``."""
        with self._log_path.open("ab") as log_file:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "benchmarks._group_members",
                *self._argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log_file,
                cwd=_ROOT,
            )
        self._reader = asyncio.create_task(self._read(), name=f"member-{self.name}")
        waiting = asyncio.create_task(self.ready.wait())
        done, _ = await asyncio.wait([waiting, self._reader], timeout=within, return_when=asyncio.FIRST_COMPLETED)
        if waiting not in done:
            waiting.cancel()
            tail = self._log_path.read_text(errors="replace")[-2000:]
            await self.kill()
            raise RuntimeError(f"member {self.name} not ready within {within:g}s; its log ends:\n{tail}")

    async def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        while line := await self._process.stdout.readline():
            event: Event = json.loads(line)
            kind = event["event"]
            if kind == "ready":
                self.ready.set()
            elif kind == "closed":
                self.closed.set()
            self._on_event(self.name, event)

    def send(self, command: str) -> None:
        process = self._process
        if process is not None and process.stdin is not None and process.returncode is None:
            process.stdin.write(f"{command}\n".encode())

    async def kill(self) -> None:
        """SIGKILL by PID and reap."""
        process = self._process
        if process is not None and process.returncode is None:
            process.kill()
            await asyncio.wait_for(process.wait(), 10)
        await self._end_reader()

    async def stop(self) -> int | None:
        """``stop``, then wait (bounded) for the member to exit; SIGKILL by PID if it does not."""
        process = self._process
        if process is None:
            return None
        self.send("stop")
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), STOP_WITHIN)
        except TimeoutError:
            process.kill()
            await asyncio.wait_for(process.wait(), 10)
        await self._end_reader()
        return process.returncode

    async def _end_reader(self) -> None:
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._reader, 5)
            self._reader = None


if __name__ == "__main__":
    sys.exit(main())
