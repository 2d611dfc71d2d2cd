"""The reassignment throttle: a leader sends a replica being added at most ``throttle_bps`` bytes per second.

``tidelog partition reassign --execute --throttle N`` records ``N`` in the partition record
(:attr:`~tidelog.metadata.records.PartitionRecord.throttle_bps`) for as long as the reassignment runs. The leader
paces its answers to the fetches (log batches and far-horizon segment bytes) of each replica being added: an
answer of ``n`` bytes makes the next one to that replica wait until ``n / N`` seconds after the later of this
answer and the previous deadline, so the replica's average rate stays at or under ``N`` whatever the fetch sizes
(the wait after an answer pays for it). One answer carries at most a second's worth (:func:`answer_cap`, at least
:data:`MIN_ANSWER_BYTES`; a log fetch's first batch comes whole), so a move smaller than a fetch is paced too
rather than sent at once. Replicas already in the
partition, and every partition not being reassigned, are never paced. The cap is per partition and replica: a
broker receiving many partitions at once receives up to ``N`` bytes per second for each.

A fetch parked at the log end (the follower has caught up) is answered by the write itself and is not paced:
it carries only what producers write, and a replica that falls behind again comes back to the paced path.
"""

from __future__ import annotations

import asyncio
import time
from weakref import WeakKeyDictionary

from tidelog.api.wire.handlers import Reply
from tidelog.metadata.records import PartitionRecord

_next: WeakKeyDictionary[object, dict[str, float]] = WeakKeyDictionary()
"""Per leader partition (the object, so a new leadership starts afresh): replica → the monotonic time from
which it may be sent more."""


MIN_ANSWER_BYTES = 4096
"""The smallest answer cap: a very low rate still moves whole pages, only less often."""


def answer_cap(record: PartitionRecord, replica: str, max_bytes: int) -> int:
    """The most bytes one answer to ``replica`` may carry: ``max_bytes``, or a second's worth when throttled."""
    rate = rate_for(record, replica)
    return max_bytes if not rate else min(max_bytes, max(rate, MIN_ANSWER_BYTES))


def rate_for(record: PartitionRecord, replica: str) -> int:
    """The bytes per second ``replica`` may be sent (0: no cap)."""
    if not record.throttle_bps or replica not in record.reassign_to or replica in record.reassign_from:
        return 0
    return record.throttle_bps


async def pace(partition: object, record: PartitionRecord, replica: str) -> None:
    """Wait until ``replica`` may be sent more of ``partition`` (at once when it is not throttled)."""
    if not rate_for(record, replica):
        return
    due = _next.get(partition, {}).get(replica, 0.0)
    wait = due - time.monotonic()
    if wait > 0:
        await asyncio.sleep(wait)


def charge(partition: object, record: PartitionRecord, replica: str, reply: Reply) -> None:
    """Count ``reply`` against ``replica``'s rate: the next answer to it waits until it is paid for."""
    size = sum(len(b) for b in reply.buffers) + (reply.file.length if reply.file is not None else 0)
    charge_bytes(partition, record, replica, size)


def held_for(partition: object, record: PartitionRecord, replica: str) -> float:
    """Seconds until ``replica`` may be sent more of ``partition`` (0: now, or not throttled); what a session
    fetch, which cannot wait for one partition alone, asks before serving it."""
    if not rate_for(record, replica):
        return 0.0
    return max(0.0, _next.get(partition, {}).get(replica, 0.0) - time.monotonic())


def charge_bytes(partition: object, record: PartitionRecord, replica: str, size: int) -> None:
    """Count ``size`` bytes sent to ``replica`` against its rate."""
    rate = rate_for(record, replica)
    if not rate or not size:
        return
    replicas = _next.setdefault(partition, {})
    replicas[replica] = max(replicas.get(replica, 0.0), time.monotonic()) + size / rate
