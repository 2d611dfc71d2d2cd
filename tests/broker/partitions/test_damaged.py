"""Who may cut a log that start-up recovery found damaged in the middle, and what a refusal says."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tidelog.broker.partitions import step_down as step_down_module
from tidelog.broker.partitions.damaged import DamagedPartitions
from tidelog.metadata.records import PartitionRecord
from tidelog.protocol.errors import CorruptDataError, InvalidArgumentError, UnavailableError
from tidelog.storage.recovery_damage import DamagedLogError, RecoveryDamage

DAMAGE = RecoveryDamage("/d/0/00000000000000000000.log", 140, 2, 3, 12, 12, 14, "CRC mismatch", 0)


def record(replicas: str, leader: str, isr: str) -> PartitionRecord:
    return PartitionRecord("s", 0, tuple(replicas), leader, tuple(isr), 3)


@pytest.mark.parametrize(
    ("partition", "setting", "allowed"),
    [
        (record("a", "a", "a"), False, False),  # a single replica: only the operator's word
        (record("a", "a", "a"), True, True),
        (record("ab", "a", "ab"), False, False),  # this broker leads: it must not serve the cut log
        (record("ab", "b", "ab"), False, True),  # a follower fetches the range again from its leader
        (record("ab", "", "a"), False, False),  # offline: nobody to fetch from (perhaps waiting for this replica)
    ],
    ids=["single", "single-allowed", "leader", "follower", "offline"],
)
def test_who_may_cut(partition: PartitionRecord, setting: bool, allowed: bool) -> None:
    assert DamagedPartitions("a", truncate_damaged=setting).may_cut(partition) is allowed


async def test_a_leader_that_can_step_down_does_not_cut_even_when_allowed() -> None:
    async def alter_isr(record: PartitionRecord, isr: tuple[str, ...]) -> None:
        pass

    damaged = DamagedPartitions("a", truncate_damaged=True, alter_isr=alter_isr)
    assert not damaged.may_cut(record("ab", "a", "ab"))  # b holds the records: step down instead
    assert damaged.may_cut(record("ab", "a", "a"))  # the last in-sync replica: the operator's word applies


def test_a_refusal_names_the_offsets_and_the_action_and_is_kept_per_leader(caplog: pytest.LogCaptureFixture) -> None:
    damaged = DamagedPartitions("a", truncate_damaged=False)
    single = record("a", "a", "a")
    with caplog.at_level(logging.ERROR):
        damaged.refuse(single, DamagedLogError("/d/0", DAMAGE))
    assert "s/0 was not opened" in caplog.text and "offsets 2..2 unreadable" in caplog.text
    assert "recovery_truncate_damaged=true" in caplog.text and "12 intact batch(es)" in caplog.text
    error = damaged.error(("s", 0))
    assert isinstance(error, CorruptDataError) and "offsets 3..14" in str(error)
    assert damaged.still_refused(single) and not damaged.still_refused(record("ab", "b", "ab"))
    assert not damaged.still_refused(record("ab", "a", "ab"))  # another ISR: asked again
    damaged.forget(("s", 0))
    assert damaged.error(("s", 0)) is None and not damaged.still_refused(single)


async def test_a_refused_leader_steps_down_asking_again_until_the_controller_takes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(step_down_module, "STEP_DOWN_RETRY_MAX", 0.01)
    answers: list[Exception | None] = [InvalidArgumentError("no in-sync replica is live"), UnavailableError("x"), None]
    asked: list[tuple[str, ...]] = []
    done = asyncio.Event()

    async def alter_isr(_: PartitionRecord, isr: tuple[str, ...]) -> None:
        asked.append(isr)
        answer = answers.pop(0)
        if answer is not None:
            raise answer
        done.set()

    damaged = DamagedPartitions("a", truncate_damaged=False, alter_isr=alter_isr)
    damaged.refuse(record("abc", "a", "abc"), DamagedLogError("/d/0", DAMAGE))
    await asyncio.wait_for(done.wait(), 10)
    assert asked == [("b", "c")] * 3  # an ISR without the damaged leader: it steps down
    await damaged.close()
