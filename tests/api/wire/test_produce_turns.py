"""ProduceTurns: a connection's produces to one partition append in request order, whatever their checks do."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from tests.helpers import BOUND
from tidelog.api.wire import produce_turns
from tidelog.api.wire.produce_turns import ProduceTurns
from tidelog.protocol.records.check import IrregularRecords
from tidelog.protocol.records.errors import InvalidBatchError
from tidelog.storage.batch_check import ProduceLimits

KEY = ("s", 0)
LIMITS = ProduceLimits.of(1 << 20, 1 << 22, 3_600_000)


class ScriptedCheck:
    """Stands in for check_produced: b"slow*" payloads are irregular (checked again in a thread); in the thread,
    b"slow-held" waits for ``held`` and b"slow-bad" is refused."""

    def __init__(self) -> None:
        self.held = threading.Event()

    def __call__(
        self, payload: Any, limits: ProduceLimits, now_ns: int, *, alone_budget: int | None = None
    ) -> list[Any]:
        data = bytes(payload)
        if alone_budget is not None:
            if data.startswith(b"slow"):
                raise IrregularRecords("too irregular to check on the loop")
            return []
        if data == b"slow-held":
            assert self.held.wait(BOUND)
        elif data == b"slow-bad":
            raise InvalidBatchError("record 7 does not decode")
        return []


async def test_a_refused_produce_lets_the_ones_behind_it_go_only_after_the_ones_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check = ScriptedCheck()
    monkeypatch.setattr(produce_turns, "check_produced", check)
    turns = ProduceTurns()
    first = asyncio.create_task(turns.check(KEY, memoryview(b"slow-held"), LIMITS, 0))
    await asyncio.sleep(0)
    refused = asyncio.create_task(turns.check(KEY, memoryview(b"slow-bad"), LIMITS, 0))
    with pytest.raises(InvalidBatchError):
        await asyncio.wait_for(refused, BOUND)
    last = asyncio.create_task(turns.check(KEY, memoryview(b"fine"), LIMITS, 0))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not last.done(), "a produce behind a refused one went ahead of the produce still being checked"
    check.held.set()
    turn = await asyncio.wait_for(first, BOUND)
    assert not last.done()
    turns.release(KEY, turn)
    turns.release(KEY, await asyncio.wait_for(last, BOUND))
