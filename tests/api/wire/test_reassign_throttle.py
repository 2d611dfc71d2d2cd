"""The reassignment throttle: only replicas being added are paced, and an answer of n bytes at N bytes per second
makes the next one to that replica wait for n / N seconds (measured on the deadline the throttle sets, not on the
wall clock)."""

from __future__ import annotations

import time

import msgspec

from tidelog.api.wire import reassign_throttle as throttle
from tidelog.api.wire.handlers import Reply
from tidelog.metadata.records import PartitionRecord

STEADY = PartitionRecord("s", 0, ("a", "b"), "a", ("a", "b"))
MOVING = msgspec.structs.replace(
    STEADY, replicas=("a", "b", "c"), reassign_from=("a", "b"), reassign_to=("a", "c"), throttle_bps=1000
)


class Leader:
    """Stands for a leader partition: the throttle keys its pacing on the object."""


def test_only_replicas_being_added_are_throttled() -> None:
    assert throttle.rate_for(MOVING, "c") == 1000
    assert throttle.rate_for(MOVING, "b") == 0  # stays (and is being removed): never paced
    assert throttle.rate_for(STEADY, "c") == 0
    assert throttle.rate_for(msgspec.structs.replace(MOVING, throttle_bps=0), "c") == 0


async def test_an_answer_delays_the_next_by_its_size_over_the_rate() -> None:
    leader = Leader()
    await throttle.pace(leader, MOVING, "c")  # nothing sent yet: no wait
    before = time.monotonic()
    throttle.charge(leader, MOVING, "c", Reply([b"x" * 500, b"y" * 500]))
    throttle.charge(leader, MOVING, "c", Reply([b"z" * 1000]))
    due = throttle._next[leader]["c"]
    assert before + 2.0 <= due <= time.monotonic() + 2.0  # 2000 bytes at 1000 bytes per second, back to back
    throttle.charge(leader, MOVING, "b", Reply([b"x" * 1000]))
    assert "b" not in throttle._next[leader]


def test_one_answer_to_a_throttled_replica_carries_at_most_a_seconds_worth() -> None:
    """Otherwise a move smaller than one fetch went at full speed in its first answer, whatever the throttle."""
    fast = msgspec.structs.replace(MOVING, throttle_bps=100_000)
    assert throttle.answer_cap(fast, "c", 8 << 20) == 100_000
    assert throttle.answer_cap(MOVING, "c", 8 << 20) == throttle.MIN_ANSWER_BYTES  # whole pages at a low rate
    assert throttle.answer_cap(MOVING, "c", 100) == 100  # never more than the fetch asked for
    assert throttle.answer_cap(MOVING, "b", 8 << 20) == 8 << 20  # not being added: not capped
