"""Partition registers: a small set of labels that appends can check and change, as in Gazette.

A partition's *registers* are a :class:`LabelSet`. An append may carry ``check_registers`` (a
:class:`LabelSelector`), ``subtract_registers`` and ``union_registers`` (label sets). The broker verifies the
check before it writes anything (a mismatch is the register-mismatch status, nothing appended) and, when the
append commits at least one record, replaces the registers with :func:`apply`. Two writers fence each other by
checking ``author=<me>`` and taking over with ``union author=<me>``; at-most-once writes are a check-and-set
over one register.

Semantics, taken from Gazette (``broker/protocol/label_extensions.go`` and ``append_fsm.go``):

- **Labels** are ``(name, value)``; a set may hold several values of one name. A set is canonical: sorted by
  name then value, without duplicates. Within a set a name cannot have both the empty value and other values.
- **Selector** ``include``/``exclude``: a set is selected when, for every name in ``include``, one of its
  values is present (an empty value matches any value of that name), and no ``exclude`` label is present (an
  empty value there excludes the name altogether). See :meth:`LabelSelector.selects`.
- **Empty registers match any selector** (:func:`matches`). Gazette's append FSM checks the selector only when
  the registers are non-empty: empty registers are the "unlocked" state, so the first writer can take a lock
  with a selector naming itself, and a partition whose registers were lost does not wedge every fenced writer.
- **Subtract then union** (:func:`apply`). :func:`subtract` removes a name only when the subtracted set holds
  *exactly* the same values for it (Gazette's ``SubtractLabelSet``), so a stale holder cannot release a lock
  another writer took, and an empty value is not a wildcard here. :func:`union` is an upsert by name (Gazette's
  ``UnionLabelSets`` with the request preferred): for each name the update mentions, its values replace the
  current ones — which is what makes ``union author=<me>`` a takeover rather than adding a second author.

Token rules (:class:`Label`) follow Gazette's, narrowed to ASCII: names are 2–64 characters, values 0–1024,
both drawn from ASCII letters, digits and ``-_+/.``. Gazette also admits non-ASCII letters and digits; ASCII
keeps length limits equal to byte limits and the sort order identical in every client language, and keeps
``=`` and spaces free for the checkpoint's text format.

Registers travel with the data (:func:`encode_labels`, at most :data:`MAX_REGISTER_LABELS` labels and
:data:`MAX_REGISTER_BYTES` bytes) and are remembered per log end offset by
:class:`~tidelog.replication.idempotence.register_history.RegisterHistory`, so that a replica truncated by leader epoch
goes back to the registers of the data it kept; the history is persisted in a checksummed checkpoint file
(:class:`~tidelog.replication.idempotence.register_history.RegisterCheckpoint`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import groupby, pairwise

import msgspec

MIN_NAME_LENGTH = 2
MAX_NAME_LENGTH = 64
MAX_VALUE_LENGTH = 1024
MAX_REGISTER_LABELS = 64
"""Most labels a partition's registers (or each half of a selector) may hold: they ride on every append."""
MAX_REGISTER_BYTES = 4096
"""Most bytes an encoded label set or selector may take, version byte included."""
ENCODING_VERSION = 1

TOKEN_SYMBOLS = "-_+/."
_TOKEN = re.compile(r"[A-Za-z0-9\-_+/.]*")
_BAD_CHAR = re.compile(r"[^A-Za-z0-9\-_+/.]")


# --------------------------------------------------------------------------------------------------- errors


class RegisterError(ValueError):
    """Base of the errors of this module: all are bad input, never a failure of the broker.

    ::

        RegisterError
         ├── InvalidLabelError          a name or value breaking the token rules, or a non-canonical set
         ├── RegisterLimitError         registers that would exceed MAX_REGISTER_LABELS or MAX_REGISTER_BYTES
         └── MalformedRegistersError    bytes that do not decode as canonical registers
    """


class InvalidLabelError(RegisterError):
    """A label name or value that breaks the token rules, or a set with a name both empty and valued.

    ``field`` is ``"name"``, ``"value"`` or ``"set"``; ``text`` the offending string (the name, for ``"set"``).
    """

    def __init__(self, field: str, text: str, reason: str) -> None:
        super().__init__(f"invalid label {field} {text[:80]!r}: {reason}")
        self.field = field
        self.text = text
        self.reason = reason


class RegisterLimitError(RegisterError):
    """Registers larger than the limits; an append that would produce them must be refused before writing."""


class MalformedRegistersError(RegisterError):
    """Bytes that are not a canonical encoding of registers (damaged, hostile, or from another encoder)."""


def _check_token(field: str, text: object, min_length: int, max_length: int) -> str:
    if not isinstance(text, str):
        raise InvalidLabelError(field, repr(text), f"must be a str, not {type(text).__name__}")
    if not min_length <= len(text) <= max_length:
        raise InvalidLabelError(field, text, f"length {len(text)}, expected {min_length} to {max_length}")
    if _TOKEN.fullmatch(text) is None:
        bad = _BAD_CHAR.search(text)
        assert bad is not None
        raise InvalidLabelError(
            field, text, f"character {bad.group()!r} at {bad.start()}; allowed: ASCII letters, digits, {TOKEN_SYMBOLS}"
        )
    return text


# ------------------------------------------------------------------------------------------------- types


@dataclass(frozen=True, slots=True, order=True)
class Label:
    """One ``(name, value)`` pair. Ordered by name, then value (code points, which for ASCII are bytes)."""

    name: str
    value: str = ""

    def __post_init__(self) -> None:
        _check_token("name", self.name, MIN_NAME_LENGTH, MAX_NAME_LENGTH)
        _check_token("value", self.value, 0, MAX_VALUE_LENGTH)

    def __str__(self) -> str:
        return f"{self.name}={self.value}"


class LabelSet:
    """An immutable, canonical set of labels: sorted, without duplicates, validated on construction.

    Canonical form makes equality, hashing and the encoding independent of how the set was built, and lets
    the set operations run as merges. Construction raises :class:`InvalidLabelError`; size limits are not
    checked here (selectors and intermediate results may be larger) but where registers are stored or sent.
    """

    __slots__ = ("_labels",)

    _labels: tuple[Label, ...]

    def __init__(self, labels: Iterable[Label | tuple[str, str]] = ()) -> None:
        canonical = sorted({label if isinstance(label, Label) else Label(*label) for label in labels})
        for previous, label in pairwise(canonical):
            if previous.name == label.name and previous.value == "":
                raise InvalidLabelError("set", label.name, "a name cannot have both an empty and other values")
        object.__setattr__(self, "_labels", tuple(canonical))

    @classmethod
    def of(cls, *pairs: tuple[str, str]) -> LabelSet:
        """``LabelSet.of(("author", "a"), ("lock", ""))``."""
        return cls(pairs)

    @classmethod
    def _trusted(cls, labels: tuple[Label, ...]) -> LabelSet:
        """A set from labels already canonical (results of the merges below): skips sorting and checks."""
        result = cls.__new__(cls)
        object.__setattr__(result, "_labels", labels)
        return result

    @property
    def labels(self) -> tuple[Label, ...]:
        return self._labels

    def names(self) -> tuple[str, ...]:
        """Distinct names, sorted."""
        return tuple(name for name, _ in groupby(label.name for label in self._labels))

    def values_of(self, name: str) -> tuple[str, ...]:
        """The values of ``name``, sorted; empty when the set lacks the name."""
        return tuple(label.value for label in self._labels if label.name == name)

    def _groups(self) -> dict[str, tuple[str, ...]]:
        return {name: tuple(label.value for label in group) for name, group in groupby(self._labels, _name)}

    def __iter__(self) -> Iterator[Label]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def __bool__(self) -> bool:
        return bool(self._labels)

    def __contains__(self, item: object) -> bool:
        return item in self._labels

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LabelSet) and self._labels == other._labels

    def __hash__(self) -> int:
        return hash(self._labels)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("LabelSet is immutable")

    def __repr__(self) -> str:
        return f"LabelSet({', '.join(map(str, self._labels))})"


def _name(label: Label) -> str:
    return label.name


EMPTY = LabelSet()


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """``include`` labels that must all be matched and ``exclude`` labels none of which may be.

    For each name in ``include``, the set must hold one of its values (an empty value: any value of the name).
    Any ``exclude`` label present in the set (an empty value: the name with any value) rejects it. The empty
    selector selects every set.
    """

    include: LabelSet = EMPTY
    exclude: LabelSet = EMPTY

    def selects(self, labels: LabelSet) -> bool:
        """Plain selector matching, without the empty-registers exception of :func:`matches`."""
        have = labels._groups()
        for name, wanted in self.include._groups().items():
            values = have.get(name)
            if values is None or not _any_value_matches(wanted, values):
                return False
        for name, unwanted in self.exclude._groups().items():
            values = have.get(name)
            if values is not None and _any_value_matches(unwanted, values):
                return False
        return True

    def __str__(self) -> str:
        parts = [str(label) for label in self.include] + [f"{label.name}!={label.value}" for label in self.exclude]
        return ",".join(parts)


def _any_value_matches(selector_values: tuple[str, ...], values: tuple[str, ...]) -> bool:
    return "" in selector_values or not set(selector_values).isdisjoint(values)


# ---------------------------------------------------------------------------------------------- operations


def matches(registers: LabelSet, selector: LabelSelector | None) -> bool:
    """Whether an append checking ``selector`` may proceed against ``registers``.

    Empty registers match any selector (Gazette checks only non-empty registers): they are the unlocked
    state. No selector (``None``) matches too.
    """
    return selector is None or not registers or selector.selects(registers)


def union(base: LabelSet, update: LabelSet) -> LabelSet:
    """``base`` with, for each name in ``update``, its values replaced by ``update``'s (an upsert by name)."""
    replaced = set(update.names())
    kept = [label for label in base if label.name not in replaced]
    return LabelSet._trusted(tuple(sorted([*kept, *update])))


def subtract(base: LabelSet, remove: LabelSet) -> LabelSet:
    """``base`` without each name for which ``remove`` holds exactly the same values.

    A name whose values differ, even by one, stays whole; an empty value in ``remove`` matches only an empty
    value in ``base``. So removal is a compare-and-delete: a writer releases only the lock it holds.
    """
    removed = remove._groups()
    base_groups = base._groups()
    return LabelSet._trusted(tuple(label for label in base if removed.get(label.name) != base_groups[label.name]))


def apply(registers: LabelSet, union_registers: LabelSet, subtract_registers: LabelSet) -> LabelSet:
    """The registers after an append: subtract, then union, as Gazette's append FSM applies them.

    Call it only for an append that commits at least one record (register changes piggy-back on the data; an
    empty append changes nothing, and one that asks to should be refused). Raises
    :class:`RegisterLimitError` when the result would exceed the limits, so the broker refuses the append
    before writing rather than producing registers it cannot replicate.
    """
    result = union(subtract(registers, subtract_registers), union_registers)
    check_limits(result)
    return result


def check_limits(labels: LabelSet) -> None:
    """Raise :class:`RegisterLimitError` unless ``labels`` may be stored as registers."""
    encode_labels(labels)


# ---------------------------------------------------------------------------------------------- encoding
#
# A label set, in a record header, a batch or a replication message:
#
#     +------+------------------------------------------------------------+
#     | 0x01 | msgpack array of strings: name0, value0, name1, value1, ... |
#     +------+------------------------------------------------------------+
#     version  labels in canonical order, at most MAX_REGISTER_LABELS pairs
#
# A selector: the version byte, then a msgpack array of two such string arrays, [include, exclude].
# The whole encoding is at most MAX_REGISTER_BYTES. Decoding accepts exactly what encoding produces: the
# version, the msgpack types, the canonical order, the token rules, the limits and no trailing bytes.

_VERSION_BYTE = bytes([ENCODING_VERSION])
_ENCODER = msgspec.msgpack.Encoder()
_SET_DECODER = msgspec.msgpack.Decoder(list[str])
_SELECTOR_DECODER = msgspec.msgpack.Decoder(tuple[list[str], list[str]])


def _flatten(labels: LabelSet, what: str) -> list[str]:
    if len(labels) > MAX_REGISTER_LABELS:
        raise RegisterLimitError(f"{what} hold {len(labels)} labels, more than {MAX_REGISTER_LABELS}")
    return [text for label in labels for text in (label.name, label.value)]


def _finish(payload: list[str] | tuple[list[str], list[str]], what: str) -> bytes:
    data = _VERSION_BYTE + _ENCODER.encode(payload)
    if len(data) > MAX_REGISTER_BYTES:
        raise RegisterLimitError(f"{what} encode to {len(data)} bytes, more than {MAX_REGISTER_BYTES}")
    return data


def encode_labels(labels: LabelSet) -> bytes:
    """The encoding of ``labels``; :class:`RegisterLimitError` when over the limits."""
    return _finish(_flatten(labels, "registers"), "registers")


def encode_selector(selector: LabelSelector) -> bytes:
    """The encoding of ``selector``; :class:`RegisterLimitError` when over the limits."""
    payload = (_flatten(selector.include, "selector include"), _flatten(selector.exclude, "selector exclude"))
    return _finish(payload, "selector")


def _payload(data: bytes | memoryview, what: str) -> memoryview:
    if len(data) > MAX_REGISTER_BYTES:
        raise MalformedRegistersError(f"{what}: {len(data)} bytes, more than {MAX_REGISTER_BYTES}")
    if len(data) == 0:
        raise MalformedRegistersError(f"{what}: empty")
    view = memoryview(data)
    if view[0] != ENCODING_VERSION:
        raise MalformedRegistersError(f"{what}: unsupported encoding version {view[0]}")
    return view[1:]


def _unflatten(flat: list[str], what: str) -> LabelSet:
    if len(flat) % 2:
        raise MalformedRegistersError(f"{what}: an odd number of strings ({len(flat)}), not name/value pairs")
    if len(flat) > 2 * MAX_REGISTER_LABELS:
        raise MalformedRegistersError(f"{what}: {len(flat) // 2} labels, more than {MAX_REGISTER_LABELS}")
    try:
        labels = tuple(Label(flat[i], flat[i + 1]) for i in range(0, len(flat), 2))
        result = LabelSet(labels)
    except InvalidLabelError as exc:
        raise MalformedRegistersError(f"{what}: {exc}") from exc
    if result.labels != labels:
        raise MalformedRegistersError(f"{what}: labels not in canonical (sorted, unique) order")
    return result


def decode_labels(data: bytes | memoryview) -> LabelSet:
    """The label set ``data`` encodes; anything else raises :class:`MalformedRegistersError`."""
    payload = _payload(data, "registers")
    try:
        flat = _SET_DECODER.decode(payload)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # msgspec reports invalid UTF-8 as the latter
        raise MalformedRegistersError(f"registers: {exc}") from exc
    return _unflatten(flat, "registers")


def decode_selector(data: bytes | memoryview) -> LabelSelector:
    """The selector ``data`` encodes; anything else raises :class:`MalformedRegistersError`."""
    payload = _payload(data, "selector")
    try:
        include, exclude = _SELECTOR_DECODER.decode(payload)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # msgspec reports invalid UTF-8 as the latter
        raise MalformedRegistersError(f"selector: {exc}") from exc
    return LabelSelector(_unflatten(include, "selector include"), _unflatten(exclude, "selector exclude"))
