"""Controller writes that a deposed controller cannot make (fencing by controller epoch).

A controller term is a (broker, epoch) pair: the election gives every term a new epoch. Every write made through a
:class:`FencedWriter` is one etcd transaction whose guard holds two comparisons besides the caller's own::

    value({prefix}/controller-epoch) == epoch of the term
    value({prefix}/controller)       == ControllerRecord(broker, epoch)   # still this term's key, on its lease

etcd evaluates the guard and applies the writes atomically, at one revision, so the write lands only if the term
is current *at the moment etcd applies it*. Nothing depends on the writer's idea of time: a controller that was
paused (SIGSTOP, a long GC, a swapped-out VM) past its lease, or cut off from etcd while another broker was
elected, wakes up still believing it is the controller, and its first write is refused. Either comparison alone
would do (an epoch is never handed out twice); both together also hold against a hand-edited epoch key.

The failure branch of the same transaction reads both keys, so when the guard fails the writer knows which part
failed without a second round trip: if the term still holds, it was the caller's own comparisons (a conflict, a
status value); otherwise the term is over and the writer raises :class:`ControllerFencedError`, after telling the
term's owner (the :class:`~tidelog.metadata.controller_election.ControllerElection`) so that it steps down.

Errors::

    ControllerError
    ├── ControllerFencedError   the term a write was made in is over; nothing was written
    └── NotControllerError      asked for a writer while not the controller; carries who is, to forward to

Any other exception from a write (etcd unreachable, a timeout) leaves its outcome unknown, as with any etcd
request: re-read before retrying.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import msgspec

from tidelog import telemetry
from tidelog.metadata.records import (
    ControllerRecord,
    Keys,
    decode_controller,
    decode_controller_epoch,
    encode_controller,
    encode_controller_epoch,
)

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ControllerTerm:
    """One broker's time as controller, named by the controller epoch it was elected with."""

    broker_id: str
    epoch: int

    @property
    def record(self) -> ControllerRecord:
        return ControllerRecord(self.broker_id, self.epoch)

    @property
    def record_bytes(self) -> bytes:
        """The controller key's value for exactly this term."""
        return encode_controller(self.record)

    @property
    def epoch_bytes(self) -> bytes:
        return encode_controller_epoch(self.epoch)


class ControllerError(Exception):
    """Base of the controller's errors."""


class ControllerFencedError(ControllerError):
    """A write was refused because the term it was made in is over. Nothing was written.

    ``current`` and ``current_epoch`` are what etcd held when it refused (``None``: no controller, or unknown when
    the term was already known to be over here and the write never left this broker).
    """

    def __init__(
        self, term: ControllerTerm, current: ControllerRecord | None, current_epoch: int | None, step: str
    ) -> None:
        holder = f"{current.broker_id}@{current.epoch}" if current is not None else "none"
        super().__init__(
            f"{step}: controller term {term.broker_id}@{term.epoch} is over "
            f"(controller {holder}, controller epoch {current_epoch})"
        )
        self.term = term
        self.current = current
        self.current_epoch = current_epoch
        self.step = step


class NotControllerError(ControllerError):
    """This broker is not the controller; ``controller_id`` is the one it knows of (``None``: none right now)."""

    def __init__(self, broker_id: str, controller_id: str | None, epoch: int) -> None:
        super().__init__(f"broker {broker_id} is not the controller (controller {controller_id}, epoch {epoch})")
        self.broker_id = broker_id
        self.controller_id = controller_id
        self.epoch = epoch


class TermOwner(Protocol):
    """What a writer tells about its term: the election that handed it out."""

    def term_is_current(self, term: ControllerTerm) -> bool:
        """False once this broker knows ``term`` is over; writes then fail without asking etcd."""
        ...

    def fenced(self, term: ControllerTerm, error: ControllerFencedError) -> None:
        """etcd refused a write of ``term``: step down. Called before the error is raised."""
        ...


@dataclass(frozen=True, slots=True)
class TxnResult:
    """A fenced transaction that etcd evaluated while its term held.

    ``committed`` is False when the caller's own comparisons failed (and the caller's failure operations ran);
    ``responses`` are the responses of whichever branch ran, in aetcd's form.
    """

    committed: bool
    responses: list[Any]


class FencedWriter:
    """Writes to etcd that land only while ``term`` is the current controller term."""

    def __init__(self, client: Any, keys: Keys, term: ControllerTerm, owner: TermOwner | None = None) -> None:
        self._client = client
        self._keys = keys
        self._owner = owner
        self.term = term

    def fence(self) -> list[Any]:
        """The guard comparisons, for code that builds its own transaction (they must all be in its compare)."""
        tx = self._client.transactions
        return [
            tx.value(self._keys.controller_epoch()) == self.term.epoch_bytes,
            tx.value(self._keys.controller()) == self.term.record_bytes,
        ]

    async def transaction(
        self, compare: Sequence[Any] = (), success: Sequence[Any] = (), failure: Sequence[Any] = ()
    ) -> TxnResult:
        """Run ``success`` if the term holds and ``compare`` is true, ``failure`` if only the term holds.

        Raises :class:`ControllerFencedError` (having told the owner) when the term is over.
        """
        if self._owner is not None and not self._owner.term_is_current(self.term):
            raise ControllerFencedError(self.term, None, None, "fence: the term already ended here")
        tx = self._client.transactions
        started = time.perf_counter()
        ok, responses = await self._client.transaction(
            compare=[*self.fence(), *compare],
            success=list(success),
            failure=[*failure, tx.get(self._keys.controller()), tx.get(self._keys.controller_epoch())],
        )
        telemetry.etcd_txn(time.perf_counter() - started)
        if ok:
            telemetry.metadata_changed()
            return TxnResult(True, list(responses))
        holder_raw = _value_of(responses[-2])
        epoch_raw = _value_of(responses[-1])
        if holder_raw == self.term.record_bytes and epoch_raw == self.term.epoch_bytes:
            return TxnResult(False, list(responses[:-2]))
        error = ControllerFencedError(
            self.term, _decode(holder_raw, decode_controller), _decode(epoch_raw, decode_controller_epoch), "fence"
        )
        if self._owner is not None:
            self._owner.fenced(self.term, error)
        raise error

    async def put(self, key: bytes, value: bytes) -> None:
        """Write ``key`` unconditionally (but fenced)."""
        await self.transaction(success=[self._client.transactions.put(key, value)])

    async def create(self, key: bytes, value: bytes) -> bool:
        """Write ``key`` only if it does not exist; False if it does."""
        tx = self._client.transactions
        result = await self.transaction(compare=[tx.version(key) == 0], success=[tx.put(key, value)])
        return result.committed

    async def replace(self, key: bytes, expected: bytes, value: bytes) -> bool:
        """Write ``key`` only if it holds exactly ``expected``; False otherwise."""
        tx = self._client.transactions
        result = await self.transaction(compare=[tx.value(key) == expected], success=[tx.put(key, value)])
        return result.committed

    async def delete(self, key: bytes, expected: bytes | None = None) -> bool:
        """Delete ``key`` if it exists (and holds ``expected``, when given); False otherwise."""
        tx = self._client.transactions
        guard = tx.version(key) > 0 if expected is None else tx.value(key) == expected
        result = await self.transaction(compare=[guard], success=[tx.delete(key)])
        return result.committed


def _value_of(range_response: Any) -> bytes | None:
    """The value a transaction's ``get`` of one key found, or None for no key."""
    return bytes(range_response[0][0]) if range_response else None


def _decode(raw: bytes | None, decode: Callable[[bytes], _T]) -> _T | None:
    if raw is None:
        return None
    try:
        return decode(raw)
    except msgspec.DecodeError:
        return None
