"""What one metadata change costs a broker, as the cluster grows: the mirror and its listeners, in process.

Run: ``.venv/bin/python -m benchmarks.metadata_changes [--quick]``. No etcd and no other process: a
:class:`~tidelog.metadata.mirror.MetadataMirror` is loaded with N one-partition streams (as a read of etcd would
give them) and handed watch events directly, with the broker's listeners attached (a
:class:`~tidelog.broker.manager.PartitionManager` holding none of the partitions, and a
:class:`~tidelog.metadata.controller.Controller` that is not elected), so the numbers are CPU time, free of
the noise of a loaded machine's I/O. Metrics, for each N (100, 1,000, 5,000; ``--quick`` 100 and 2,000):

- ``change_us_{N}``: microseconds of CPU from one partition record's watch event until the snapshot holding it
  is published (its listeners ran); its peer is the same at the smallest N (target ratio ≤ 2: a change costs
  what changed, not what the cluster holds);
- ``failover_ms_{N}``: the same for a transaction that moves the leaders of a third of the partitions (N/3
  events delivered together); its peer is the smallest N's scaled by N (target ratio ≤ 1: the cost grows with
  the partitions that changed, not faster).

Each side of a comparison is this tree's code: to compare with another revision, run this module with
``PYTHONPATH`` pointing at that revision's ``src``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from benchmarks._common import Row, emit, log, median
from tidelog.broker.manager import PartitionManager
from tidelog.metadata.controller import Controller
from tidelog.metadata.mirror import MetadataMirror
from tidelog.metadata.records import BrokerRecord, Keys, PartitionRecord, StreamRecord, encode
from tidelog.storage.config import LogConfig

BENCH = "metadata_changes"
KEYS = Keys("/bench")


@dataclass
class _KV:
    key: bytes
    value: bytes
    mod_revision: int = 0


@dataclass
class _Event:
    kv: _KV
    kind: str = "PUT"


class _Read(list[_KV]):
    """A whole read of the prefix, as aetcd returns it."""

    def __init__(self, kvs: list[_KV], revision: int) -> None:
        super().__init__(kvs)
        self.header = msgspec.structs.replace(_Header(), revision=revision)


class _Header(msgspec.Struct):
    revision: int = 0


class _Nats:
    async def subscribe(self, *args: Any, **kwargs: Any) -> _Nats:
        return self


def _record(i: int, leader: str, epoch: int) -> PartitionRecord:
    return PartitionRecord(f"s{i}", 0, ("x", "y", "z"), leader, ("x", "y", "z"), epoch)


async def measure(count: int, changes: int) -> tuple[float, float]:
    """(CPU µs per one-partition change, CPU ms per failover of a third) with ``count`` partitions."""
    mirror = MetadataMirror(client=None, keys=KEYS)
    with tempfile.TemporaryDirectory() as tmp:
        manager = PartitionManager("b", Path(tmp), _Nats(), lambda _s: LogConfig(), ack_timeout=5.0)
        mirror.add_listener(manager.reconcile)
        Controller("b", None, KEYS, mirror)  # registers itself; never elected here
        kvs = [_KV(KEYS.broker(b), encode(BrokerRecord(b, "127.0.0.1", 1, 2, 0))) for b in "xyz"]
        kvs += [_KV(KEYS.stream(f"s{i}"), encode(StreamRecord(f"s{i}", f"s{i}", "", 1, 3, 0))) for i in range(count)]
        kvs += [_KV(KEYS.partition(f"s{i}", 0), encode(_record(i, "x", 1))) for i in range(count)]
        publisher = getattr(mirror, "_publish_loop", None)
        task = asyncio.create_task(publisher()) if publisher is not None else None
        await mirror._load(_Read(kvs, 1), False)
        revision = 1

        async def deliver(events: list[_Event]) -> float:
            nonlocal revision
            revision += 1
            started = time.process_time()
            for event in events:
                event.kv.mod_revision = revision
                await mirror._apply(event)
            target = revision
            await mirror.wait_for(lambda s: s.revision >= target, 60)
            return time.process_time() - started

        singles = []
        for n in range(changes):
            i = n % count
            event = _Event(_KV(KEYS.partition(f"s{i}", 0), encode(_record(i, "x", 2 + n))))
            singles.append(await deliver([event]))
        third = range(0, count, 3)
        failovers = []
        for n in range(3):
            leader = "yz"[n % 2]
            events = [_Event(_KV(KEYS.partition(f"s{i}", 0), encode(_record(i, leader, 100 + n)))) for i in third]
            failovers.append(await deliver(events))
        if task is not None:
            task.cancel()
        await manager.close()
    return median(singles) * 1e6, median(failovers) * 1e3


async def main_async(args: argparse.Namespace) -> None:
    sizes = [100, 2_000] if args.quick else [100, 1_000, 5_000]
    results = {}
    for count in sizes:
        results[count] = await measure(count, 50 if args.quick else 200)
        log(f"N={count}: one change {results[count][0]:.0f} µs, a failover of N/3 {results[count][1]:.1f} ms")
    base = results[sizes[0]]
    rows = []
    for count in sizes:
        single, failover = results[count]
        rows.append(Row(BENCH, f"change_us_{count}", single, "µs CPU", base[0]))
        rows.append(Row(BENCH, f"failover_ms_{count}", failover, "ms CPU", base[1] * count / sizes[0], 2))
    for row in rows:
        emit(row.document())
    emit(
        {
            "bench": BENCH,
            "metric": "summary",
            "metrics": [{"metric": r.metric, "ratio": r.document()["ratio"]} for r in rows],
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.metadata_changes", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N of 100 and 2,000, fewer changes")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
