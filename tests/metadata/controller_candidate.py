"""A controller candidate in a process of its own, for tests that pause it with SIGSTOP.

    python controller_candidate.py HOST PORT PREFIX BROKER_ID TTL_SECONDS

It campaigns and reports on stdout, one line each: ``elected EPOCH``, ``deposed EPOCH REASON``. Each stdin line
``write KEY`` writes KEY through the writer of the last term it was elected for, whatever it believes now, and
reports ``write ok`` or ``write refused STEP``. It resigns and exits at the end of stdin.
"""

from __future__ import annotations

import asyncio
import sys

import aetcd

from tidelog.metadata.controller_election import ControllerElection, DeposedReason
from tidelog.metadata.fenced_writer import ControllerFencedError, ControllerTerm, FencedWriter
from tidelog.metadata.records import Keys


def say(line: str) -> None:
    print(line, flush=True)


async def main(host: str, port: int, prefix: str, broker_id: str, ttl: int) -> None:
    client = aetcd.Client(host=host, port=port, timeout=10)
    writers: list[FencedWriter] = []

    async def elected(term: ControllerTerm) -> None:
        writers.append(election.writer())
        say(f"elected {term.epoch}")

    async def deposed(term: ControllerTerm, reason: DeposedReason) -> None:
        say(f"deposed {term.epoch} {reason.value}")

    election = ControllerElection(
        client, Keys(prefix), broker_id, ttl_seconds=ttl, on_elected=elected, on_deposed=deposed, retry_seconds=0.1
    )
    await election.start()
    stdin = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    try:
        while line := (await stdin.readline()).decode().strip():
            command, _, key = line.partition(" ")
            if command != "write" or not writers:
                say(f"bad command {line!r}")
                continue
            try:
                await writers[-1].put(key.encode(), broker_id.encode())
                say("write ok")
            except ControllerFencedError as error:
                say(f"write refused {error.step}")
    finally:
        await election.stop()
        await client.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])))
