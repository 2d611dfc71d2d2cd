"""Replicas whose disk failed a write or an fsync: the leader steps down, and the log is recovered before it
serves again (Kafka takes a failed log directory offline and moves its leaderships; this is that, per log).

After a failed fsync the kernel may have dropped dirty pages it will never write, while the page cache still
shows them, and a retried fsync "succeeds" without them (fsyncgate). A log that failed an fsync, or a write
(``EIO``: a full disk is not a failure, :mod:`tidelog.storage.disk_full`), is therefore *poisoned*
(:mod:`tidelog.storage.flush`): it refuses appends, so nothing it could not make durable is ever acknowledged,
and no fsync of it is retried. The write that met the failure is answered TIMEOUT (in doubt, retriable: its bytes
may be on the followers). What happens next:

- **A leader with another in-sync replica steps down** (:mod:`~tidelog.broker.partitions.step_down`): the
  controller hands the leadership to an ISR member, which holds every committed record, and leaves this broker
  out of the ISR. Meanwhile appends are refused with UNAVAILABLE (clients retry on the new leader). Asked when a
  write meets the failure and at every maintenance tick (an idle leader whose seal failed), once per record.
- **A leader alone** (one replica, or no other in-sync one) has nobody to move to: it keeps refusing appends
  until the broker restarts, and logs an ERROR saying so. It steps down as soon as a follower has caught up and
  rejoined the ISR (the next tick sees the new ISR).
- **Recovery, as a follower** (the leader once stepped down, or a follower whose own disk failed): the poisoned
  log is closed without a flush, opened again from its files, and cut to its *durable end*
  (:attr:`~tidelog.storage.log.Log.durable_end`: the log end at its last fsync that succeeded). What the files
  show beyond that may exist only in the page cache, so it is not trusted: it is fetched again from the leader,
  written and fsynced anew. Only then does the fetcher start; the replica rejoins the ISR as any follower does,
  once caught up. While the disk still fails (the cut, its fsync or a later append fails), the log is closed
  and the recovery tried again, 1 s after the failure doubling to 10 s.
- **Elected leader while recovering** (the last ISR member, once the leader died): the log opens as a restart
  would, uncut: a leader's cut could drop records only it holds. A broker restart also opens a log as it is
  on disk: the in-memory durable end is gone, so a restart without a power cut trusts whatever the page cache
  still shows (``docs/durability.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from tidelog.broker.partitions.step_down import AlterIsr, step_down
from tidelog.clock import Clock, SystemClock
from tidelog.metadata.snapshot import PartitionKey
from tidelog.storage.log import Log
from tidelog.storage.recovery_damage import DamagedLogError

if TYPE_CHECKING:
    from tidelog.broker.partitions.partition import Partition

log = logging.getLogger(__name__)

RETRY_FIRST = 1.0  # seconds before the first retry of a recovery whose disk still failed
RETRY_MAX = 10.0

Retry = Callable[[PartitionKey], Awaitable[None]]
"""Brings one partition in line with its record again (the manager's): the recovery's next attempt."""


class FailedLogs:
    """This broker's logs that failed a write or an fsync: leaders stepping down, logs waiting to be recovered."""

    def __init__(
        self, broker_id: str, *, alter_isr: AlterIsr | None, retry: Retry | None = None, clock: Clock | None = None
    ) -> None:
        self._broker_id = broker_id
        self._alter_isr = alter_isr
        self._retry = retry
        self._clock: Clock = clock or SystemClock()
        self._durable: dict[PartitionKey, int] = {}  # logs to recover -> where to cut them
        self._stepping: dict[PartitionKey, tuple[tuple[int, tuple[str, ...]], asyncio.Task[None]]] = {}
        self._alone: dict[PartitionKey, tuple[int, tuple[str, ...]]] = {}  # leaders told they cannot step down
        self._retries: dict[PartitionKey, asyncio.Task[None]] = {}
        self._delay: dict[PartitionKey, float] = {}

    # -- leaders --------------------------------------------------------------------------------------------

    def leader_failed(self, partition: Partition) -> None:
        """``partition``'s log failed while this broker leads it: step down if another in-sync replica can take
        it (once per record), else say once per record why appends stay refused."""
        record = partition.record
        if record.leader != self._broker_id:
            return
        key = (record.stream, record.id)
        state = (record.leader_epoch, record.isr)
        failure = partition.log.flusher.failed
        others = tuple(b for b in record.isr if b != self._broker_id)
        if len(record.replicas) < 2 or not others or self._alter_isr is None:
            if self._alone.get(key) != state:
                self._alone[key] = state
                why = "it has one replica" if len(record.replicas) < 2 else "no other replica is in sync"
                log.error(
                    "%s: its log failed (%s) and %s: appends are refused (UNAVAILABLE) until broker %s restarts%s",
                    partition.name,
                    failure,
                    why,
                    self._broker_id,
                    "" if len(record.replicas) < 2 else ", or until a follower is back in the ISR (then it steps down)",
                )
            return
        running = self._stepping.get(key)
        if running is not None and running[0] == state:
            return  # asked under this record already: the metadata moves this replica on
        if running is not None:
            running[1].cancel()
        log.error(
            "%s: its log failed (%s): broker %s acknowledges nothing more and steps down for in-sync replicas %s; "
            "it recovers its log as a follower",
            partition.name,
            failure,
            self._broker_id,
            ", ".join(others),
        )
        task = asyncio.create_task(
            step_down(self._alter_isr, record, self._broker_id, others, self._clock), name=f"step-down-{key}"
        )
        self._stepping[key] = (state, task)

    # -- recovery ---------------------------------------------------------------------------------------------

    def note(self, key: PartitionKey, log_: Log) -> None:
        """``log_`` failed and is about to be closed: recover it when it is opened next (:meth:`recover`)."""
        durable = log_.durable_end
        self._durable[key] = min(durable, self._durable.get(key, durable))
        self._alone.pop(key, None)
        stepping = self._stepping.pop(key, None)
        if stepping is not None:
            stepping[1].cancel()

    async def retire(self, key: PartitionKey, log_: Log, stop: Awaitable[None]) -> None:
        """Stop running a replica whose log failed (``stop``: the manager's), and close the log without trusting
        it: its next opening cuts it to its durable end (:meth:`recover`)."""
        self.note(key, log_)
        try:
            await stop
        except Exception as exc:  # its checkpoints and its close reach a failing disk
            log.warning("%s/%d: closing its failed log: %s", *key, exc)
        await close_failed(log_)

    async def opened(self, key: PartitionKey, opening: Awaitable[Log], *, leading: bool) -> Log | None:
        """``opening`` (a log being opened), recovered when it failed before (:meth:`recover`): None when its disk
        still fails (closed again, and a retry scheduled). A log that did not fail opens as ever: its errors are
        the caller's."""
        if key not in self._durable:
            return await opening
        try:
            log_ = await opening
        except DamagedLogError:
            raise
        except Exception as exc:  # start-up recovery fsyncs what it scanned
            self._still_failing(key, exc)
            return None
        if await self.recover(key, log_, leading=leading):
            return log_
        await close_failed(log_)
        return None

    async def recover(self, key: PartitionKey, log_: Log, *, leading: bool) -> bool:
        """Cut a log just opened again to what its disk holds, and make that durable; True when it may serve.
        False (and a retry scheduled) when the disk still fails: the caller closes it."""
        durable = self._durable.get(key)
        if durable is None:
            return True
        name = f"{key[0]}/{key[1]}"
        if leading:
            log.warning(
                "%s: elected leader while its log recovers from a failed disk: opened as on disk, not cut to the "
                "durable end %d (a leader's cut could drop records only it holds)",
                name,
                durable,
            )
            self._recovered(key)
            return True
        end = log_.end_offset
        try:
            if end > durable:
                if durable < log_.start_offset:
                    await log_.reset_to(log_.start_offset)
                else:
                    await log_.truncate_to(durable)
            await log_.flush()
        except Exception as exc:
            self._still_failing(key, exc)
            return False
        log.warning(
            "%s: log recovered after its disk failed: cut from %d to %d (what was fsynced); the rest is fetched "
            "again from the leader before it rejoins the ISR",
            name,
            end,
            log_.end_offset,
        )
        self._recovered(key)
        return True

    def _still_failing(self, key: PartitionKey, exc: Exception) -> None:
        delay = self._delay.get(key, RETRY_FIRST)
        log.warning("%s/%d: recovering its log failed (%s): the disk still fails; again in %.0fs", *key, exc, delay)
        self.retry_later(key)

    def _recovered(self, key: PartitionKey) -> None:
        self._durable.pop(key, None)  # the back-off stays: a disk that fails again is retried more slowly

    def retry_later(self, key: PartitionKey) -> None:
        """Have the manager bring ``key`` in line again after a back-off (the disk still failed)."""
        if self._retry is None or key in self._retries:
            return
        delay = self._delay.get(key, RETRY_FIRST)
        self._delay[key] = min(delay * 2, RETRY_MAX)
        retry = self._retry

        async def later() -> None:
            await self._clock.sleep(delay)
            self._retries.pop(key, None)
            try:
                await retry(key)
            except Exception:
                log.exception("%s/%d: recovering its failed log failed", *key)

        self._retries[key] = asyncio.create_task(later(), name=f"recover-log-{key}")

    def forget(self, key: PartitionKey) -> None:
        """The partition left this broker (deleted, reassigned away)."""
        self._durable.pop(key, None)
        self._delay.pop(key, None)
        self._alone.pop(key, None)
        stepping = self._stepping.pop(key, None)
        if stepping is not None:
            stepping[1].cancel()
        retry = self._retries.pop(key, None)
        if retry is not None:
            retry.cancel()

    async def close(self) -> None:
        """Stop every step-down and retry still under way (the broker stops)."""
        tasks = [task for _, task in self._stepping.values()] + list(self._retries.values())
        self._stepping.clear()
        self._retries.clear()
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)


async def close_failed(log_: Log) -> None:
    """Close a log whose disk failed: nothing more is flushed or marked clean (its next opening recovers)."""
    try:
        await log_.close()
    except Exception as exc:
        log.debug("closing %s: %s", log_.directory, exc)
