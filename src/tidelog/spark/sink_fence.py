"""The fence of a streaming sink task: which (micro-batch, task) slices a tidelog partition holds, in registers.

Each task of micro-batch ``N`` appends its rows for a partition in one transactional append
(:mod:`~tidelog.spark.sink_commit`). Spark may run that task again — a retry, a speculative copy, or the whole
micro-batch replayed after the driver died before or after its commit — so the partition's registers
(:mod:`tidelog.protocol.labels`) record which tasks of the latest micro-batch are in, and every append checks
and updates that record in the same compare-and-set. The design and its proof sketch are in
``docs/design/spark-sink.md``; this module is the arithmetic.

Slots. Task ``t`` (Spark's partition id of the task) owns bit ``t // S`` of slot ``t % S``, where ``S`` is the
sink's ``registerSlots`` option. Slot ``s`` of query ``q`` is label ``spark.<q>.<s>`` with value
``<N>.<S>.<bits>``: micro-batch ``N``, the slot count, and the tasks of ``N`` in that slot whose slice is in this
partition, as a hexadecimal bitmap. ``S`` must stay the same for the life of a checkpoint (a task's slot and bit
depend on it): a task that finds a label of its query written with another ``S`` fails, naming both.

Only tasks of one slot contend for a label: with ``S`` at least the number of tasks running at once, tasks
writing one partition concurrently touch different labels, and the broker applies their appends in turn
without refusing any. A query holds at most ``S`` labels per partition however long it runs: the label of a
slot is reset by the first task of the next micro-batch that writes there.

Decision for task ``t`` of batch ``B`` (:func:`decide`), from the slot's value ``<N>.<S>.<bits>``:

- no label: APPEND, checking that the label is still absent;
- ``N > B``: SKIP — a later micro-batch runs, so Spark committed ``B``, so every task of ``B`` succeeded;
- ``N == B`` and ``t``'s bit set: SKIP — this slice is in;
- otherwise APPEND, checking that the label still holds exactly what was read, and setting it to
  ``<B>.<bits | t's bit>`` (``N == B``) or ``<B>.<t's bit>`` (``N < B``: a new micro-batch).

A query checkpointed by an earlier version of the sink, whose driver recorded the last micro-batch of the whole
query in label ``spark.<q>``, keeps that guarantee: a task of a micro-batch at or below it is skipped.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tidelog.protocol.labels import MAX_NAME_LENGTH, LabelSelector, LabelSet

REGISTER_PREFIX = "spark."
DEFAULT_SLOTS = 8
MAX_SLOTS = 32


class FenceError(RuntimeError):
    """A register this sink reads holds something it cannot have written (another program uses its names)."""


class Action(enum.Enum):
    """What a partition's registers say to do with a task's slice."""

    APPEND = "append"  # the slice is not there: append it, with the decision's check and mark
    SKIP = "skip"  # the partition holds this slice, or a later micro-batch: a repeat of the task


@dataclass(frozen=True, slots=True)
class Fence:
    """Who a task is: its streaming query, micro-batch and Spark partition id; ``slots`` as in the module."""

    query_id: str
    batch_id: int
    task: int
    slots: int = DEFAULT_SLOTS

    def __post_init__(self) -> None:
        if not 1 <= self.slots <= MAX_SLOTS:
            raise ValueError(f"slots must be 1..{MAX_SLOTS}, got {self.slots}")
        if self.batch_id < 0 or self.task < 0:
            raise ValueError(f"a batch id and a task are not negative (got {self.batch_id}, {self.task})")
        if len(slot_label(self.query_id, MAX_SLOTS - 1)) > MAX_NAME_LENGTH:
            raise ValueError(f"query id {self.query_id!r} is too long for a register name")

    @property
    def label(self) -> str:
        return slot_label(self.query_id, self.task % self.slots)

    @property
    def bit(self) -> int:
        return 1 << (self.task // self.slots)


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    seen: str | None  # the slot's value as read; None: no label
    check: LabelSelector | None  # for APPEND: the registers must still be as read
    mark: LabelSet | None  # for APPEND: the slot's new value


def slot_label(query_id: str, slot: int) -> str:
    """The label of slot ``slot`` of query ``query_id``."""
    return f"{REGISTER_PREFIX}{query_id}.{slot}"


def legacy_label(query_id: str) -> str:
    """The label in which the earlier, driver-side sink recorded the query's last micro-batch."""
    return REGISTER_PREFIX + query_id


def parse_slot(value: str, name: str) -> tuple[int, int, int]:
    """A slot's value ``<batch>.<slots>.<hex bits>`` as (batch, slots, bits)."""
    parts = value.split(".")
    try:
        if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
            raise ValueError(value)
        return int(parts[0]), int(parts[1]), int(parts[2], 16)
    except ValueError:
        raise FenceError(
            f"register {name} holds {value!r}, not <batch>.<slots>.<bits>: not written by this sink"
        ) from None


def slot_value(batch_id: int, slots: int, bits: int) -> str:
    return f"{batch_id}.{slots}.{bits:x}"


def _only(registers: LabelSet, name: str) -> str | None:
    values = registers.values_of(name)
    if len(values) > 1:
        raise FenceError(f"register {name} holds {', '.join(values)}: not written by this sink")
    return values[0] if values else None


def decide(registers: LabelSet, fence: Fence) -> Decision:
    """Whether ``fence``'s slice must still be appended to a partition whose registers are ``registers``."""
    legacy = _only(registers, legacy_label(fence.query_id))
    if legacy is not None and legacy.isdigit() and int(legacy) >= fence.batch_id:
        return Decision(Action.SKIP, None, None, None)
    _check_slots(registers, fence)
    name = fence.label
    seen = _only(registers, name)
    if seen is None:
        mark = LabelSet.of((name, slot_value(fence.batch_id, fence.slots, fence.bit)))
        return Decision(Action.APPEND, None, LabelSelector(exclude=LabelSet.of((name, ""))), mark)
    batch, _, bits = parse_slot(seen, name)
    if batch > fence.batch_id or (batch == fence.batch_id and bits & fence.bit):
        return Decision(Action.SKIP, seen, None, None)
    now = bits | fence.bit if batch == fence.batch_id else fence.bit
    mark = LabelSet.of((name, slot_value(fence.batch_id, fence.slots, now)))
    return Decision(Action.APPEND, seen, LabelSelector(include=LabelSet.of((name, seen))), mark)


def _check_slots(registers: LabelSet, fence: Fence) -> None:
    """Every label of the query must have been written with the fence's slot count."""
    prefix = slot_label(fence.query_id, 0)[:-1]
    for label in registers:
        if label.name.startswith(prefix) and label.name[len(prefix) :].isdigit():
            _, slots, _ = parse_slot(label.value, label.name)
            if slots != fence.slots:
                raise FenceError(
                    f"register {label.name} was written with registerSlots={slots}, and this task runs with "
                    f"{fence.slots}: a query keeps its registerSlots for the life of its checkpoint"
                )
