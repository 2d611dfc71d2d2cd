"""Keeping a replica's producer state in step with its log, whatever changes the log.

The producer state (:mod:`tidelog.replication.idempotence.producer_state`) must describe exactly the batches the log
holds: a batch in the log but missing from the state would be written again when its producer retries after a
failover; a batch in the state but gone from the log would be acknowledged with offsets that hold something
else. Every writer of a replica's log therefore tells the state, with the functions here:

==========================  ======================================================================================
the log changed by          the state
==========================  ======================================================================================
leader append               reserved before, recorded or released once the append finished
                            (:class:`~tidelog.broker.partitions.partition.Partition`)
follower append             :func:`record_replicated`: the headers of the replicated payload, stored as-is
epoch truncation            :func:`after_truncation`: cut exactly, or rebuilt from a snapshot and the log
reset (catch-up)            :func:`after_truncation` too: the log restarts at the leader's log start
installed segments          :func:`after_install`: the headers of the installed range
start-up                    :func:`open_producer_state`: the newest snapshot, then the log after it
==========================  ======================================================================================

Snapshots (:func:`take_snapshot`) are taken only at an offset the state reflects exactly: by a leader while no
append is reserved, by a follower's fetcher between two of its own appends, and when a replica closes. They are
small (a few rows per producer) and written synchronously: between the encoding and the rename nothing else
runs on the loop, so no truncation can slip in and leave a snapshot describing a log tail that is gone.
"""

from __future__ import annotations

import asyncio
import logging

from tidelog.protocol.records import iter_batches
from tidelog.replication.idempotence.producer_snapshot import (
    ProducerSnapshots,
    ReadableLog,
    encode_snapshot,
    iter_log_headers,
    load_producer_state,
)
from tidelog.replication.idempotence.producer_state import DEFAULT_PRODUCER_EXPIRY_MS, ProducerStateTable
from tidelog.storage.atomic import write_atomically
from tidelog.storage.log import Log

log = logging.getLogger(__name__)

SNAPSHOT_INTERVAL_NS = 30 * 1_000_000_000  # at most one snapshot per replica this often, and only if it grew
SNAPSHOTS_RETAINED = 3  # older ones serve when the newest is damaged, or lies above a truncation point


def open_producer_state(log_: Log, producer_expiry_ms: int = DEFAULT_PRODUCER_EXPIRY_MS) -> ProducerStateTable:
    """The producer state of a log just opened (blocking: a scan of the log after the newest snapshot)."""
    return load_producer_state(log_, ProducerSnapshots(log_.directory), producer_expiry_ms=producer_expiry_ms)


def record_replicated(table: ProducerStateTable, log_: ReadableLog, payload: memoryview | bytes) -> None:
    """Record the batches of a follower append that the log now holds.

    Called whether the append returned, failed or was cancelled: the write itself is synchronous under the log's
    lock, so after any of these the log holds either a batch whole or not at all, and its end says which.
    """
    end = log_.end_offset
    table.rebuild(header for _, header in iter_batches(payload, verify=False) if header.next_offset <= end)


def after_truncation(table: ProducerStateTable, log_: ReadableLog, snapshots: ProducerSnapshots) -> None:
    """The log was cut at its (new) end: forget what lies beyond, exactly or by a rebuild.

    Snapshots above the new end describe batches the log no longer holds and are deleted first; a rebuild then
    starts from the newest snapshot at or below the end.
    """
    end = log_.end_offset
    snapshots.delete_above(end)
    if table.truncate_to(end):
        return
    log.info("%s: producer state not exact after truncation to %d: rebuilding it", snapshots.directory, end)
    fresh = load_producer_state(log_, snapshots, clock=table.clock, producer_expiry_ms=table.producer_expiry_ms)
    table.replace_with(fresh)


def after_install(table: ProducerStateTable, log_: ReadableLog, start: int) -> None:
    """Segment files were installed from ``start`` on: record their batches (headers only, no records)."""
    table.rebuild(iter_log_headers(log_, start))


def take_snapshot(table: ProducerStateTable, snapshots: ProducerSnapshots, offset: int) -> bool:
    """Snapshot ``table`` as of ``offset`` and keep the newest few; False (logged) when it could not be written.

    The caller guarantees that the table reflects every batch below ``offset`` and none above.
    """
    try:
        snapshots.write(table, offset)
        snapshots.retain(SNAPSHOTS_RETAINED)
    except (OSError, ValueError) as exc:
        log.warning("%s: cannot write a producer snapshot at %d: %s", snapshots.directory, offset, exc)
        return False
    return True


async def take_snapshot_off_loop(table: ProducerStateTable, snapshots: ProducerSnapshots, offset: int) -> bool:
    """:func:`take_snapshot`, the table encoded here (exact as of ``offset``) and the file written, synced and
    the old ones deleted in a worker thread: a broker snapshotting thousands of partitions in one maintenance
    pass does not stall its event loop on their fsyncs (docs/performance.md, "Many partitions")."""
    try:
        data = encode_snapshot(table, offset)
        await asyncio.to_thread(_write_and_retain, snapshots, offset, data)
    except (OSError, ValueError) as exc:
        log.warning("%s: cannot write a producer snapshot at %d: %s", snapshots.directory, offset, exc)
        return False
    return True


def _write_and_retain(snapshots: ProducerSnapshots, offset: int, data: bytes) -> None:
    write_atomically(snapshots.path_for(offset), data)
    snapshots.retain(SNAPSHOTS_RETAINED)


__all__ = [
    "SNAPSHOTS_RETAINED",
    "SNAPSHOT_INTERVAL_NS",
    "after_install",
    "after_truncation",
    "open_producer_state",
    "record_replicated",
    "take_snapshot",
    "take_snapshot_off_loop",
]
