"""Controller election: every broker campaigns, and at most one at a time holds the controller key.

Keys (see :class:`~tidelog.metadata.records.Keys`)::

    {prefix}/controller         ControllerRecord(broker_id, epoch), put with the candidate's own lease
    {prefix}/controller-epoch   the last controller epoch handed out; never deleted, only ever grows

**Campaign.** Read the epoch key: value ``e`` and mod revision ``r`` (``e = r = 0`` while it does not exist). Then
one transaction::

    if   version(controller) == 0  and  mod_revision(controller-epoch) == r
    then put controller-epoch = e+1;  put controller = (me, e+1) with my lease     -> I lead term (me, e+1)
    else get controller                                                            -> I follow its holder

If the key was free but the epoch moved (another campaign won and its winner already left), campaign again at
once. Otherwise watch the controller key from the revision after the one just seen, so that no change between
the transaction and the watch is missed, and campaign again when the key is deleted or replaced.

**Exactly one controller, and a new epoch for each.** etcd serialises transactions, and the first one to commit
makes ``version(controller) == 0`` false for every other until the key is deleted. The mod-revision comparison
makes the read-increment-write of the epoch atomic, so two terms can never share an epoch and epochs strictly
increase with each election. A term is therefore named by its record alone: the key holding ``(me, e)`` means
term ``e`` is still mine.

**Terms end** when this broker learns any of: the watch saw the key deleted or replaced (``KEY_LOST``; lease
expiry shows up this way), the keep-alive heard from etcd that the lease is gone (``LEASE_LOST``), a fenced write
was refused (``FENCED``: the election then deletes the key if it is somehow still this term's, so that a new
election can run), or :meth:`ControllerElection.stop` resigned (``RESIGNED``: the controller's work is stopped
first, through ``on_deposed``, then the key is deleted, guarded by its value, and the lease revoked, so a
successor is elected at once instead of a TTL later).

**Safety never rests on this broker's belief.** Under a pause (SIGSTOP, GC, a frozen VM) longer than the TTL, or
a partition from etcd, or a keep-alive that is merely slow, etcd expires the lease and another broker is
elected, while this one still *believes* it is the controller until it hears otherwise — which may be never while
it is cut off. That is harmless: every controller write goes through a
:class:`~tidelog.metadata.fenced_writer.FencedWriter` whose transaction compares the epoch key and the controller
key with the term, so etcd refuses the deposed controller's first write, and the refusal itself ends the term.
Timers only affect how soon things happen (how fast a dead controller is replaced), never what is allowed. The
one thing fencing cannot cover is an effect outside etcd (a request to another broker): such requests must carry
the controller epoch so that their receivers can refuse a lower one, as Kafka's brokers do.

**Lease.** The election keeps its own lease (a :class:`~tidelog.metadata.lease_session.LeaseSession`), not the
broker registration's: resigning revokes it, which must not make the broker look dead; it can have its own TTL
(how fast a controller is replaced); and its loss is observed, so a new one is taken for the next campaign. The
cost is one more keep-alive per broker.

Callbacks ``on_elected(term)`` and ``on_deposed(term, reason)`` strictly alternate, one pair per term, and are
awaited on the election's task: they should start or stop work and return, not run it. ``is_controller`` turns
false the moment the term is known to be over, before ``on_deposed`` runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from tidelog.clock import Clock, SystemClock
from tidelog.launch.reachability import ReachabilityLog, describe_failure, etcd_address
from tidelog.metadata.fenced_writer import ControllerFencedError, ControllerTerm, FencedWriter, NotControllerError
from tidelog.metadata.lease_session import LeaseSession, is_lease_not_found
from tidelog.metadata.records import ControllerRecord, Keys, decode_controller, decode_controller_epoch

log = logging.getLogger(__name__)


class ElectionState(enum.Enum):
    """Where this broker stands in the election."""

    STOPPED = "stopped"
    """Not started, or stopped."""
    CAMPAIGNING = "campaigning"
    """No controller known here right now: this broker is about to try, or trying, to take the key."""
    FOLLOWING = "following"
    """Another broker holds the controller key (:attr:`ControllerElection.controller_id`)."""
    LEADING = "leading"
    """This broker holds the controller key and its term has not ended: it is the controller."""


class DeposedReason(enum.Enum):
    """Why a term ended, as passed to ``on_deposed``."""

    RESIGNED = "resigned"
    """:meth:`ControllerElection.stop` gave the key up."""
    KEY_LOST = "key-lost"
    """The controller key was deleted or now holds another term: the lease expired, or somebody removed it."""
    LEASE_LOST = "lease-lost"
    """etcd told the keep-alive that the lease is gone (expired or revoked), so the key is gone with it."""
    FENCED = "fenced"
    """etcd refused a fenced write of the term."""


ElectedCallback = Callable[[ControllerTerm], Awaitable[None]]
DeposedCallback = Callable[[ControllerTerm, DeposedReason], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class _Seen:
    """The controller key as one campaign left it."""

    raw: bytes
    """Its value."""
    watch_from: int
    """The first revision whose changes to the key this broker has not seen yet."""


class ControllerElection:
    """One broker's candidacy for controller; see the module docstring for the protocol."""

    def __init__(
        self,
        client: Any,
        keys: Keys,
        broker_id: str,
        *,
        ttl_seconds: int = 10,
        clock: Clock | None = None,
        on_elected: ElectedCallback | None = None,
        on_deposed: DeposedCallback | None = None,
        retry_seconds: float = 0.5,
    ) -> None:
        self.broker_id = broker_id
        self._client = client
        self._keys = keys
        self._ttl = ttl_seconds
        self._clock = clock or SystemClock()
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self._retry = retry_seconds
        self._session: LeaseSession | None = None  # the lease the next campaign puts the key with
        self._task: asyncio.Task[None] | None = None
        self._stopping = False  # stop() ends the loop through this too, not only by cancelling it (see stop)
        self._state = ElectionState.STOPPED
        self._term: ControllerTerm | None = None  # this broker's term, from winning until on_deposed has run
        self._ended: DeposedReason | None = None  # set the moment _term is known to be over
        self._holder: ControllerRecord | None = None  # the controller key's record, as last seen
        self._epoch = 0  # the highest controller epoch seen
        self._wake = asyncio.Event()  # interrupts the watch: the term ended here, or stop()
        self._changed = asyncio.Event()  # replaced on every change of the views below; see wait_for

    # ---- views ----

    @property
    def state(self) -> ElectionState:
        return self._state

    @property
    def is_controller(self) -> bool:
        """Whether this broker believes it is the controller. Its writes are fenced whatever it believes."""
        return self._term is not None and self._ended is None

    @property
    def term(self) -> ControllerTerm | None:
        """This broker's current term, or None when it is not the controller."""
        return self._term if self.is_controller else None

    @property
    def epoch(self) -> int:
        """The highest controller epoch this broker has seen (0: none yet)."""
        return self._epoch

    @property
    def controller_id(self) -> str | None:
        """The controller as this broker last saw it (None: none right now)."""
        if self.is_controller:
            return self.broker_id
        return self._holder.broker_id if self._holder is not None else None

    @property
    def lease_id(self) -> int | None:
        """The lease the controller key is (or would be) put with."""
        return self._session.id if self._session is not None and not self._session.lost else None

    def writer(self) -> FencedWriter:
        """A writer for the current term; raises :class:`NotControllerError` when there is none."""
        term = self.term
        if term is None:
            raise NotControllerError(self.broker_id, self.controller_id, self._epoch)
        return FencedWriter(self._client, self._keys, term, owner=self)

    async def wait_for(
        self, predicate: Callable[[ControllerElection], bool], timeout: float | None = None
    ) -> ControllerElection:
        """Wait until ``predicate(self)`` holds, e.g. ``lambda e: e.is_controller``."""
        async with asyncio.timeout(timeout):
            while not predicate(self):
                await self._changed.wait()
        return self

    # ---- lifecycle ----

    async def start(self) -> None:
        """Take a lease and start campaigning; the outcome is seen through the views, callbacks and wait_for."""
        if self._task is not None:
            raise RuntimeError(f"the election of {self.broker_id} is already running")
        await self._live_session()
        self._stopping = False
        self._wake.clear()
        self._set_state(ElectionState.CAMPAIGNING)
        self._task = asyncio.create_task(self._run(), name=f"controller-election-{self.broker_id}")

    async def stop(self) -> None:
        """Stop campaigning; if this broker is the controller, resign (see the module docstring)."""
        task, self._task = self._task, None
        if task is not None:
            # Cancelling alone is not enough: on Python 3.11, asyncio.wait_for (which aetcd uses to create a
            # watch) swallows a cancellation that arrives as the wait completes, and the loop would run on. The
            # flag and the wake-up make the loop end by itself within one etcd request either way.
            self._stopping = True
            self._wake.set()
            task.cancel()
            await asyncio.wait({task})  # not `await task`: a cancellation of stop() itself must still propagate
        term = self._term
        if term is not None:
            if self._ended is None:
                self._end_now(DeposedReason.RESIGNED)
            await self._finish_term()
            try:
                await self._resign(term)
            except Exception as exc:  # etcd unreachable: revoking (or the lease's expiry) removes the key instead
                log.debug("controller %s: could not resign term %d", self.broker_id, term.epoch, exc_info=True)
                log.warning(
                    "controller %s: could not resign term %d (%s); another broker is elected once its lease lapses",
                    self.broker_id,
                    term.epoch,
                    describe_failure(exc),
                )
        if self._session is not None:
            await self._session.close()
            self._session = None
        self._set_state(ElectionState.STOPPED)

    # ---- TermOwner: what fenced writers report ----

    def term_is_current(self, term: ControllerTerm) -> bool:
        return self._term == term and self._ended is None

    def fenced(self, term: ControllerTerm, error: ControllerFencedError) -> None:
        if not self.term_is_current(term):
            return
        log.warning("controller %s: a write was fenced, stepping down: %s", self.broker_id, error)
        self._holder = error.current
        self._saw_epoch(error.current_epoch or 0)
        self._end_now(DeposedReason.FENCED)

    # ---- the campaign loop ----

    async def _run(self) -> None:
        reach = ReachabilityLog(log, "etcd", etcd_address(self._client))
        while not self._stopping:
            try:
                seen = await self._campaign()
                reach.reachable(f"controller election of {self.broker_id}")
                if seen is not None:
                    await self._watch(seen)
            except Exception as error:  # etcd unreachable, a timeout, a broken watch: look again shortly
                if is_lease_not_found(error) and self._session is not None:
                    self._session.mark_lost()
                reach.unreachable(describe_failure(error), f"controller election of {self.broker_id}: retrying")
                await self._clock.sleep(self._retry)
            await self._settle()

    async def _campaign(self) -> _Seen | None:
        """One campaign transaction; None when it must simply be tried again."""
        session = await self._live_session()
        tx = self._client.transactions
        controller, epoch_key = self._keys.controller(), self._keys.controller_epoch()
        found = await self._client.get(epoch_key)
        epoch = decode_controller_epoch(found.value) if found is not None else 0
        self._saw_epoch(epoch)
        bid = ControllerTerm(self.broker_id, epoch + 1)
        ok, responses = await self._client.transaction(
            compare=[tx.version(controller) == 0, tx.mod(epoch_key) == (found.mod_revision if found else 0)],
            success=[tx.put(epoch_key, bid.epoch_bytes), tx.put(controller, bid.record_bytes, lease=session.id)],
            failure=[tx.get(controller)],
        )
        if ok:
            await self._observe(bid.record_bytes, session.id)
            return _Seen(bid.record_bytes, int(responses[-1].response_put.header.revision) + 1)
        if not responses[0]:
            return None  # the key is free but the epoch moved since we read it: somebody else campaigned
        value, kv = responses[0][0]
        await self._observe(bytes(value), int(kv.lease))
        return _Seen(bytes(value), int(kv.mod_revision) + 1)

    async def _observe(self, raw: bytes, lease: int) -> None:
        """The controller key holds ``raw`` on ``lease``: update the views, end or begin this broker's term."""
        holder = _decode_holder(raw)
        self._holder = holder
        self._saw_epoch(holder.epoch if holder is not None else 0)
        if self._term is not None and raw != self._term.record_bytes:
            if self._ended is None:
                self._end_now(DeposedReason.KEY_LOST)
            await self._finish_term()
        session = self._session
        mine = holder is not None and holder.broker_id == self.broker_id
        if self._term is None and mine and session is not None and not session.lost and lease == session.id:
            # The key is ours on our live lease: we won (or won earlier and the answer was lost in a timeout).
            assert holder is not None
            await self._begin(ControllerTerm(holder.broker_id, holder.epoch))
        elif self._term is None:
            self._set_state(ElectionState.FOLLOWING if holder is not None else ElectionState.CAMPAIGNING)

    async def _watch(self, seen: _Seen) -> None:
        """Return when the controller key changes, the lease is lost, the term ends here, or stop() is called."""
        if self._wake.is_set():
            return
        watch = await self._client.watch(self._keys.controller(), start_revision=seen.watch_from)
        try:
            changed = asyncio.create_task(self._until_changed(watch, seen.raw))
            waiters = [changed, asyncio.create_task(self._wake.wait())]
            if self._session is not None:
                waiters.append(asyncio.create_task(self._session.wait_lost()))
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
                await asyncio.gather(*waiters, return_exceptions=True)
            error = changed.exception() if changed.done() and not changed.cancelled() else None
            if error is not None:
                raise error  # the watch broke: the loop looks at the key afresh
        finally:
            with contextlib.suppress(Exception):
                await watch.cancel()

    async def _until_changed(self, watch: Any, raw: bytes) -> None:
        async for event in watch:
            value = None if event.kind == "DELETE" else bytes(event.kv.value)
            if value == raw:
                continue
            self._holder = _decode_holder(value) if value is not None else None
            self._saw_epoch(self._holder.epoch if self._holder is not None else 0)
            if self._term is not None and self._ended is None and raw == self._term.record_bytes:
                self._end_now(DeposedReason.KEY_LOST)
            else:
                self._set_state(ElectionState.FOLLOWING if self._holder is not None else ElectionState.CAMPAIGNING)
            return

    async def _settle(self) -> None:
        """After a watch: finish a term that ended, and give up the key of a fenced one."""
        if not self._stopping:
            self._wake.clear()
        term = self._term
        if term is None:
            return
        if self._ended is None and self._session is not None and self._session.lost:
            self._end_now(DeposedReason.LEASE_LOST)
        reason = self._ended
        if reason is None:
            return
        await self._finish_term()
        # A fenced term's key may still be there (the epoch key was edited by hand, say); while it is, nobody can
        # be elected, and this broker would find the key "its own" again. Delete it, guarded by its value.
        while reason is DeposedReason.FENCED and not self._stopping:
            try:
                await self._resign(term)
                return
            except Exception as error:
                log.warning("controller %s: could not give up fenced term %d: %s", self.broker_id, term.epoch, error)
                await self._clock.sleep(self._retry)

    # ---- term bookkeeping ----

    async def _begin(self, term: ControllerTerm) -> None:
        self._term, self._ended, self._holder = term, None, term.record
        self._saw_epoch(term.epoch)
        self._set_state(ElectionState.LEADING)
        log.info("broker %s is the controller, epoch %d", self.broker_id, term.epoch)
        if self._on_elected is not None:
            try:
                await self._on_elected(term)
            except Exception:
                log.exception("controller %s: on_elected(%d) failed", self.broker_id, term.epoch)

    def _end_now(self, reason: DeposedReason) -> None:
        """Mark the term over at once (is_controller turns false); _finish_term runs the callback later."""
        self._ended = reason
        self._wake.set()
        others = self._holder is not None and self._holder.broker_id != self.broker_id
        self._set_state(ElectionState.FOLLOWING if others else ElectionState.CAMPAIGNING)

    async def _finish_term(self) -> None:
        term, reason = self._term, self._ended
        if term is None or reason is None:
            return
        self._term, self._ended = None, None
        self._notify()
        log.info("broker %s is no longer the controller (epoch %d): %s", self.broker_id, term.epoch, reason.value)
        if self._on_deposed is not None:
            try:
                await self._on_deposed(term, reason)
            except Exception:
                log.exception("controller %s: on_deposed(%d) failed", self.broker_id, term.epoch)

    async def _resign(self, term: ControllerTerm) -> bool:
        """Delete the controller key if it still holds ``term``; False if it did not."""
        tx = self._client.transactions
        key = self._keys.controller()
        ok, _ = await self._client.transaction(
            compare=[tx.value(key) == term.record_bytes], success=[tx.delete(key)], failure=[]
        )
        return bool(ok)

    async def _live_session(self) -> LeaseSession:
        if self._session is None or self._session.lost:
            if self._session is not None:
                await self._session.close(revoke=False)
            session = LeaseSession(self._client, self._ttl, clock=self._clock, name=f"controller-{self.broker_id}")
            await session.open()
            self._session = session
        return self._session

    def _saw_epoch(self, epoch: int) -> None:
        if epoch > self._epoch:
            self._epoch = epoch
            self._notify()

    def _set_state(self, state: ElectionState) -> None:
        self._state = state
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


def _decode_holder(raw: bytes) -> ControllerRecord | None:
    try:
        return decode_controller(raw)
    except msgspec.DecodeError:
        log.error("the controller key holds an undecodable value: %r", raw[:64])
        return None
