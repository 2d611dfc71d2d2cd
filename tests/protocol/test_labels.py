"""Label sets (the registers' data model): Gazette's selector semantics, subtract-then-union, canonical sets, token
rules, the binary encoding (round trips and refusal of anything else)."""

from __future__ import annotations

import contextlib

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.protocol.labels import (
    EMPTY,
    MAX_NAME_LENGTH,
    MAX_REGISTER_BYTES,
    MAX_REGISTER_LABELS,
    MAX_VALUE_LENGTH,
    InvalidLabelError,
    Label,
    LabelSelector,
    LabelSet,
    MalformedRegistersError,
    RegisterLimitError,
    apply,
    decode_labels,
    decode_selector,
    encode_labels,
    encode_selector,
    matches,
    subtract,
    union,
)


def ls(*labels: str) -> LabelSet:
    """``ls("a=1", "b=")``: a label set from ``name=value`` strings."""
    return LabelSet(tuple(text.split("=", 1)) for text in labels)  # type: ignore[misc]


def sel(include: tuple[str, ...] = (), exclude: tuple[str, ...] = ()) -> LabelSelector:
    return LabelSelector(ls(*include), ls(*exclude))


# --------------------------------------------------------------------------------------------- strategies

_ALPHABET = "abcAB09-_+/."
names = st.sampled_from(["ab", "author", "lock", "x.y", "zz"])
values = st.sampled_from(["", "1", "2", "a", "b-c"])
any_names = st.text(_ALPHABET, min_size=2, max_size=8)
any_values = st.text(_ALPHABET, max_size=8)


def _valid(pairs: list[tuple[str, str]]) -> LabelSet:
    """Drop pairs that would give a name both the empty and other values, then build the set."""
    by_name: dict[str, set[str]] = {}
    for name, value in pairs:
        by_name.setdefault(name, set()).add(value)
    kept = [(n, v) for n, vs in by_name.items() for v in vs if v or len(vs) == 1]
    return LabelSet(kept)


label_sets = st.lists(st.tuples(names, values), max_size=8).map(_valid)
wide_label_sets = st.lists(st.tuples(any_names, any_values), max_size=MAX_REGISTER_LABELS).map(_valid)
selectors = st.builds(LabelSelector, label_sets, label_sets)


def _model(labels: LabelSet) -> dict[str, set[str]]:
    model: dict[str, set[str]] = {}
    for label in labels:
        model.setdefault(label.name, set()).add(label.value)
    return model


def _model_selects(selector: LabelSelector, labels: LabelSet) -> bool:
    """The selector rule as Gazette states it, over a dict of name → values."""
    have = _model(labels)
    for name, wanted in _model(selector.include).items():
        if name not in have or not ("" in wanted or wanted & have[name]):
            return False
    return all(
        not (name in have and ("" in unwanted or unwanted & have[name]))
        for name, unwanted in _model(selector.exclude).items()
    )


# ---------------------------------------------------------------------------------------------- labels


def test_a_set_is_sorted_and_deduplicated() -> None:
    labels = LabelSet([("bb", "2"), ("ab", "z"), ("bb", "1"), ("bb", "2"), Label("ab", "z")])
    assert [str(label) for label in labels] == ["ab=z", "bb=1", "bb=2"]
    assert labels == ls("bb=1", "ab=z", "bb=2")
    assert hash(labels) == hash(ls("bb=2", "bb=1", "ab=z"))
    assert labels.names() == ("ab", "bb")
    assert labels.values_of("bb") == ("1", "2")
    assert labels.values_of("cc") == ()
    assert Label("ab", "z") in labels
    assert len(labels) == 3 and labels and not EMPTY


def test_a_set_is_immutable() -> None:
    labels = ls("ab=1")
    with pytest.raises(AttributeError):
        labels._labels = ()
    with pytest.raises(AttributeError):
        Label("ab", "1").name = "cd"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "value", "field", "fragment"),
    [
        ("a", "", "name", "length 1, expected 2 to 64"),
        ("a" * (MAX_NAME_LENGTH + 1), "", "name", "length 65"),
        ("ab", "v" * (MAX_VALUE_LENGTH + 1), "value", "length 1025, expected 0 to 1024"),
        ("a b", "", "name", "character ' ' at 1"),
        ("ab", "x=y", "value", "character '=' at 1"),
        ("ab", "é", "value", "character 'é' at 0"),
        ("ab", "1\n", "value", "character '\\n' at 1"),
        ("ab:", "", "name", "character ':' at 2"),
    ],
)
def test_token_rules_name_the_fault(name: str, value: str, field: str, fragment: str) -> None:
    with pytest.raises(InvalidLabelError) as info:
        Label(name, value)
    assert info.value.field == field
    assert fragment in str(info.value)


def test_token_rules_accept_the_whole_alphabet_and_the_bounds() -> None:
    Label("aZ09-_+/.", "aZ09-_+/.")
    Label("ab", "")
    Label("n" * MAX_NAME_LENGTH, "v" * MAX_VALUE_LENGTH)


def test_a_label_must_be_strings() -> None:
    with pytest.raises(InvalidLabelError, match="must be a str, not int"):
        Label("ab", 1)  # type: ignore[arg-type]


def test_a_name_cannot_be_both_empty_and_valued() -> None:
    with pytest.raises(InvalidLabelError) as info:
        ls("ab=", "ab=1")
    assert info.value.field == "set"
    assert info.value.text == "ab"
    ls("ab=")  # alone it is fine


# -------------------------------------------------------------------------------------------- matching


@pytest.mark.parametrize(
    ("labels", "selector", "selected"),
    [
        (("ab=1",), sel(), True),
        (("ab=1",), sel(("ab=1",)), True),
        (("ab=1",), sel(("ab=2",)), False),
        (("ab=1",), sel(("ab=",)), True),  # empty include value: any value of the name
        (("cd=1",), sel(("ab=",)), False),  # ... but the name must be there
        (("ab=1",), sel(("ab=1", "ab=2")), True),  # several values of one name: any one of them
        (("ab=3",), sel(("ab=1", "ab=2")), False),
        (("ab=1", "cd=2"), sel(("ab=1", "cd=2")), True),  # every include name must match
        (("ab=1", "cd=3"), sel(("ab=1", "cd=2")), False),
        (("ab=1",), sel(exclude=("ab=1",)), False),
        (("ab=1",), sel(exclude=("ab=2",)), True),
        (("ab=1",), sel(exclude=("ab=",)), False),  # empty exclude value: the name at all
        (("cd=1",), sel(exclude=("ab=",)), True),
        (("ab=1", "ab=2"), sel(exclude=("ab=2",)), False),
        (("ab=1",), sel(("ab=1",), ("cd=",)), True),
        (("ab=1", "cd=x"), sel(("ab=1",), ("cd=",)), False),
    ],
)
def test_selector(labels: tuple[str, ...], selector: LabelSelector, selected: bool) -> None:
    assert selector.selects(ls(*labels)) is selected
    assert matches(ls(*labels), selector) is selected


def test_empty_registers_match_any_selector() -> None:
    assert not sel(("author=a",)).selects(EMPTY)
    assert matches(EMPTY, sel(("author=a",)))
    assert matches(EMPTY, sel(exclude=("author=",)))
    assert matches(ls("author=b"), None)
    assert not matches(ls("author=b"), sel(("author=a",)))


@given(label_sets, selectors)
def test_selector_agrees_with_the_model(labels: LabelSet, selector: LabelSelector) -> None:
    assert selector.selects(labels) is _model_selects(selector, labels)
    assert matches(labels, selector) is (not labels or _model_selects(selector, labels))


def test_selector_string() -> None:
    assert str(sel(("ab=1", "cd="), ("ef=2",))) == "ab=1,cd=,ef!=2"


# ------------------------------------------------------------------------------------------ operations


def test_union_replaces_the_values_of_each_name_it_mentions() -> None:
    assert union(ls("author=a", "lock=1"), ls("author=b")) == ls("author=b", "lock=1")
    assert union(ls("ab=1", "ab=2"), ls("ab=3")) == ls("ab=3")
    assert union(ls("ab=1"), ls("cd=2")) == ls("ab=1", "cd=2")
    assert union(ls("ab=1"), EMPTY) == ls("ab=1")
    assert union(EMPTY, ls("ab=1", "ab=2")) == ls("ab=1", "ab=2")


def test_subtract_removes_a_name_only_on_exactly_its_values() -> None:
    assert subtract(ls("author=a", "lock=1"), ls("author=a")) == ls("lock=1")
    assert subtract(ls("author=a"), ls("author=b")) == ls("author=a")  # a stale holder releases nothing
    assert subtract(ls("ab=1", "ab=2"), ls("ab=1")) == ls("ab=1", "ab=2")  # the whole group must match
    assert subtract(ls("ab=1", "ab=2"), ls("ab=1", "ab=2")) == EMPTY
    assert subtract(ls("ab=1"), ls("ab=")) == ls("ab=1")  # no wildcard in subtract
    assert subtract(ls("ab="), ls("ab=")) == EMPTY
    assert subtract(ls("ab=1"), ls("cd=1")) == ls("ab=1")


def test_apply_subtracts_then_unions() -> None:
    # The same name in both: the union lands last, so it wins.
    assert apply(ls("author=a"), union_registers=ls("author=a"), subtract_registers=ls("author=a")) == ls("author=a")
    # A lock handed over: release mine, take the new one, keep unrelated registers.
    assert apply(ls("author=a", "epoch=3"), ls("author=b"), ls("author=a")) == ls("author=b", "epoch=3")
    assert apply(EMPTY, EMPTY, EMPTY) == EMPTY


@given(label_sets, label_sets, label_sets)
def test_operations_agree_with_the_model(registers: LabelSet, update: LabelSet, remove: LabelSet) -> None:
    have, add, drop = _model(registers), _model(update), _model(remove)
    subtracted = {n: vs for n, vs in have.items() if drop.get(n) != vs}
    assert _model(subtract(registers, remove)) == subtracted
    assert _model(union(registers, update)) == {**have, **add}
    assert _model(apply(registers, update, remove)) == {**subtracted, **add}
    result = apply(registers, update, remove)
    assert result == LabelSet(result)  # results are canonical


def test_apply_refuses_registers_over_the_limit() -> None:
    many = LabelSet((f"n{i:02}", "v") for i in range(MAX_REGISTER_LABELS))
    assert len(apply(EMPTY, many, EMPTY)) == MAX_REGISTER_LABELS
    with pytest.raises(RegisterLimitError, match="65 labels"):
        apply(many, ls("zz=1"), EMPTY)
    big = LabelSet((f"n{i}", "v" * 1000) for i in range(5))
    with pytest.raises(RegisterLimitError, match="bytes, more than 4096"):
        apply(EMPTY, big, EMPTY)


# -------------------------------------------------------------------------------------------- encoding


def test_encoding_layout() -> None:
    assert encode_labels(EMPTY) == b"\x01\x90"
    assert encode_labels(ls("ab=1")) == b"\x01" + msgspec.msgpack.encode(["ab", "1"])
    assert encode_selector(sel(("ab=1",), ("cd=",))) == b"\x01" + msgspec.msgpack.encode([["ab", "1"], ["cd", ""]])


@given(wide_label_sets)
def test_labels_round_trip(labels: LabelSet) -> None:
    data = encode_labels(labels)
    assert len(data) <= MAX_REGISTER_BYTES
    assert decode_labels(data) == labels
    assert decode_labels(memoryview(data)) == labels


@given(selectors)
def test_selectors_round_trip(selector: LabelSelector) -> None:
    assert decode_selector(encode_selector(selector)) == selector


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"", "empty"),
        (b"\x02\x90", "unsupported encoding version 2"),
        (b"\x01", "truncated"),
        (b"\x01\x90\x00", "trailing"),
        (b"\x01" + msgspec.msgpack.encode(["ab"]), "odd number"),
        (b"\x01" + msgspec.msgpack.encode(["ab", 1]), "Expected `str`, got `int`"),
        (b"\x01" + msgspec.msgpack.encode({"ab": "1"}), "Expected `array`"),
        (b"\x01" + msgspec.msgpack.encode(["cd", "1", "ab", "1"]), "canonical"),
        (b"\x01" + msgspec.msgpack.encode(["ab", "1", "ab", "1"]), "canonical"),
        (b"\x01" + msgspec.msgpack.encode(["a", "1"]), "invalid label name"),
        (b"\x01" + msgspec.msgpack.encode(["ab", "x y"]), "invalid label value"),
        (b"\x01" + msgspec.msgpack.encode(["ab", "", "ab", "1"]), "both an empty and other values"),
        (b"\x01" + msgspec.msgpack.encode(["ab", "1"] * (MAX_REGISTER_LABELS + 1)), "more than 64"),
        (b"\x01" + b"\x00" * MAX_REGISTER_BYTES, "more than 4096"),
    ],
)
def test_decoding_refuses_malformed_labels(data: bytes, fragment: str) -> None:
    with pytest.raises(MalformedRegistersError, match=fragment):
        decode_labels(data)


@pytest.mark.parametrize(
    "data",
    [
        b"\x01" + msgspec.msgpack.encode(["ab", "1"]),
        b"\x01" + msgspec.msgpack.encode([["ab", "1"]]),
        b"\x01" + msgspec.msgpack.encode([["ab", "1"], [], []]),
        b"\x01" + msgspec.msgpack.encode([["ab"], []]),
        b"\x01" + msgspec.msgpack.encode([[], ["ab", "1", "ab", "1"]]),
    ],
)
def test_decoding_refuses_malformed_selectors(data: bytes) -> None:
    with pytest.raises(MalformedRegistersError):
        decode_selector(data)


def test_encoding_refuses_what_decoding_would() -> None:
    with pytest.raises(RegisterLimitError):
        encode_labels(LabelSet((f"n{i:02}", "") for i in range(MAX_REGISTER_LABELS + 1)))
    with pytest.raises(RegisterLimitError):
        encode_selector(LabelSelector(exclude=LabelSet((f"n{i}", "v" * 1000) for i in range(5))))


@given(st.binary(max_size=64))
def test_decoding_arbitrary_bytes_refuses_or_is_canonical(data: bytes) -> None:
    with contextlib.suppress(MalformedRegistersError):
        assert encode_labels(decode_labels(data)) == data
    with contextlib.suppress(MalformedRegistersError):
        assert encode_selector(decode_selector(data)) == data


@given(wide_label_sets, st.data())
def test_damaged_encodings_refuse_or_stay_canonical(labels: LabelSet, data: st.DataObject) -> None:
    encoded = bytearray(encode_labels(labels))
    position = data.draw(st.integers(0, len(encoded) - 1))
    encoded[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(encoded)))
    for damaged in (bytes(encoded), bytes(encoded[:cut])):
        try:
            decoded = decode_labels(damaged)
        except MalformedRegistersError:
            continue
        assert encode_labels(decoded) == damaged
