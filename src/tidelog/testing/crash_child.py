"""A process that appends to a log until it is killed, reporting every acknowledged append on stdout.

Crash tests (``tests/storage/test_crash.py``) run it with ``python -m tidelog.testing.crash_child DIR SEED``,
kill it with SIGKILL at a random moment, reopen the log, and check that every append it reported is there,
byte for byte. Flush policy ``ALWAYS``: a line is printed only after :meth:`Log.append` returned, that is after
a group fsync covered the batch, so anything reported must survive.

Several appenders run concurrently (so group commit is what is being crashed), segments are small (so rolls
are crashed too), and batches vary in size and record count. Each report line is JSON::

    {"base": 17, "last": 21, "sha256": "…"}   # offsets and digest of the batch exactly as stored

The first line is ``{"ready": true, "end": N}`` once the log is open (N = its end offset after recovery).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import sys

from tidelog.protocol.records import NewRecord, assign_offsets, build_batch
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.log import Log

EPOCH = 3
CONFIG = LogConfig(segment_max_bytes=64 * 1024, index_interval_bytes=1024, flush_policy=FlushPolicy.ALWAYS)


def _batch(rng: random.Random, n: int) -> bytes:
    count = rng.randint(1, 12)
    records = [NewRecord(rng.randbytes(rng.randint(0, 600)), key=str(n).encode()) for _ in range(count)]
    return build_batch(records, timestamp=1_700_000_000_000_000_000 + n)


async def _appender(log: Log, rng: random.Random, name: int) -> None:
    n = 0
    while True:
        data = _batch(rng, name * 1_000_000 + n)
        result = await log.append(data, EPOCH)
        stored = bytearray(data)
        assign_offsets(stored, 0, result.base_offset, EPOCH)
        line = {"base": result.base_offset, "last": result.last_offset, "sha256": hashlib.sha256(stored).hexdigest()}
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()
        n += 1


async def main(directory: str, seed: int, appenders: int = 4) -> None:
    log = await Log.open_async(directory, CONFIG)
    sys.stdout.write(json.dumps({"ready": True, "end": log.end_offset}) + "\n")
    sys.stdout.flush()
    await asyncio.gather(*(_appender(log, random.Random(seed * 100 + i), i) for i in range(appenders)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
