"""The fence's decisions, without a broker: which slices a partition's registers say are in."""

from __future__ import annotations

import pytest

from tidelog.protocol.labels import LabelSelector, LabelSet
from tidelog.spark.sink_fence import Action, Fence, FenceError, decide, legacy_label, slot_label

QUERY = "4f1c2a7e-0000-4000-8000-00000000cafe"


def fence(batch: int, task: int, slots: int = 4) -> Fence:
    return Fence(QUERY, batch, task, slots)


def test_a_task_owns_one_bit_of_one_slot() -> None:
    assert (fence(0, 6).label, fence(0, 6).bit) == (slot_label(QUERY, 2), 0b10)
    assert (fence(0, 1, slots=1).label, fence(0, 1, slots=1).bit) == (slot_label(QUERY, 0), 0b10)
    assert len(slot_label(QUERY, 31)) <= 64  # a register name's limit
    with pytest.raises(ValueError, match="slots must be"):
        fence(0, 0, slots=33)


def test_the_decision_is_a_compare_and_set_on_the_tasks_slot() -> None:
    name = slot_label(QUERY, 1)
    fresh = decide(LabelSet.of(("author", "someone")), fence(3, 5))
    assert fresh.action is Action.APPEND and fresh.seen is None
    assert fresh.check == LabelSelector(exclude=LabelSet.of((name, "")))
    assert fresh.mark == LabelSet.of((name, "3.4.2"))
    same_batch = decide(LabelSet.of((name, "3.4.1")), fence(3, 5))  # task 1 of batch 3 is in; task 5 is not
    assert same_batch.check == LabelSelector(include=LabelSet.of((name, "3.4.1")))
    assert same_batch.mark == LabelSet.of((name, "3.4.3"))
    older = decide(LabelSet.of((name, "2.4.3")), fence(3, 5))  # a new micro-batch starts the slot again
    assert older.action is Action.APPEND and older.mark == LabelSet.of((name, "3.4.2"))


@pytest.mark.parametrize(
    ("value", "batch"),
    [("3.4.2", 3), ("3.4.3", 3), ("4.4.0", 3), ("9.4.1", 3)],
)
def test_a_slice_that_is_in_or_a_later_micro_batch_is_skipped(value: str, batch: int) -> None:
    assert decide(LabelSet.of((slot_label(QUERY, 1), value)), fence(batch, 5)).action is Action.SKIP


def test_other_queries_and_the_earlier_sinks_label() -> None:
    other = slot_label("0a0a0a0a-1111-4222-8333-444444444444", 1)
    assert decide(LabelSet.of((other, "9.4.2")), fence(3, 5)).action is Action.APPEND
    assert decide(LabelSet.of((legacy_label(QUERY), "3")), fence(3, 5)).action is Action.SKIP
    assert decide(LabelSet.of((legacy_label(QUERY), "2")), fence(3, 5)).action is Action.APPEND


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ([(slot_label(QUERY, 1), "seven")], "not written by this sink"),
        ([(slot_label(QUERY, 1), "1.4.1"), (slot_label(QUERY, 1), "2.4.1")], "not written by this sink"),
        ([(slot_label(QUERY, 3), "1.8.1")], "registerSlots=8, and this task runs with 4"),
    ],
)
def test_labels_this_sink_cannot_have_written_fail_loudly(labels: list[tuple[str, str]], message: str) -> None:
    with pytest.raises(FenceError, match=message):
        decide(LabelSet.of(*labels), fence(3, 5))
