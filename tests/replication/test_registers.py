"""Registers: Gazette's selector semantics, subtract-then-union, canonical sets, token rules, the binary encoding
(round trips and refusal of anything else), and the register history with its checkpoint file."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import crc32c
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.replication.register_history import RegisterCheckpoint, RegisterHistory, decode_history, encode_history
from tidelog.replication.registers import (
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
from tidelog.storage.errors import CheckpointError


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


# --------------------------------------------------------------------------------------------- history


def test_history_answers_by_log_end() -> None:
    history = RegisterHistory()
    assert history.latest == EMPTY
    assert history.record(10, ls("author=a"))
    assert not history.record(12, ls("author=a"))  # unchanged: nothing recorded
    assert history.record(20, ls("author=b"))
    assert history.entries() == [(10, ls("author=a")), (20, ls("author=b"))]
    assert [history.at(o) for o in (0, 9, 10, 19, 20, 99)] == [
        EMPTY,
        EMPTY,
        *[ls("author=a")] * 2,
        *[ls("author=b")] * 2,
    ]
    assert history.latest == ls("author=b")


def test_history_truncation_restores_the_registers_of_the_kept_data() -> None:
    history = RegisterHistory([(10, ls("author=a")), (20, ls("author=b")), (30, EMPTY)])
    history.truncate_to(25)
    assert history.latest == ls("author=b")
    history.truncate_to(20)  # the append that set author=b ended at 20: it is kept
    assert history.latest == ls("author=b")
    history.truncate_to(19)
    assert history.latest == ls("author=a")
    assert history.record(19, ls("author=c"))  # the end after truncation may be reused by the new leader
    history.truncate_to(0)
    assert history.entries() == []
    assert history.latest == EMPTY


def test_history_refuses_appends_out_of_order() -> None:
    history = RegisterHistory([(10, ls("ab=1"))])
    for offset in (10, 5):
        with pytest.raises(ValueError, match="cannot follow 10"):
            history.record(offset, ls("ab=2"))
    with pytest.raises(ValueError, match="cannot follow 0"):
        RegisterHistory().record(0, ls("ab=1"))
    with pytest.raises(RegisterLimitError):
        history.record(11, LabelSet((f"n{i:02}", "") for i in range(MAX_REGISTER_LABELS + 1)))


def test_history_compaction_keeps_what_offsets_above_the_floor_need() -> None:
    history = RegisterHistory([(10, ls("ab=1")), (20, ls("ab=2")), (30, ls("ab=3"))])
    history.compact(25)
    assert history.floor == 25
    assert history.entries() == [(20, ls("ab=2")), (30, ls("ab=3"))]
    assert history.at(25) == ls("ab=2")
    history.compact(5)  # the floor never goes down
    assert history.floor == 25
    with pytest.raises(ValueError, match="forgotten"):
        history.at(24)
    with pytest.raises(ValueError, match="below the floor"):
        history.truncate_to(24)
    history.truncate_to(25)
    assert history.latest == ls("ab=2")
    with pytest.raises(ValueError, match="cannot follow 25"):
        history.record(25, ls("ab=9"))
    empty = RegisterHistory()
    empty.compact(7)
    assert empty.at(7) == EMPTY


@pytest.mark.parametrize(
    ("entries", "floor", "fragment"),
    [
        ([(10, ls("ab=1")), (10, ls("ab=2"))], 0, "must increase"),
        ([(0, ls("ab=1"))], 0, "not 0"),
        ([(10, ls("ab=1")), (20, ls("ab=1"))], 0, "repeats"),
        ([(10, ls("ab=1")), (20, ls("ab=2"))], 20, "at or below 20"),
        ([], -1, "negative"),
    ],
)
def test_history_invariants(entries: list[tuple[int, LabelSet]], floor: int, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        RegisterHistory(entries, floor=floor)


@given(st.lists(st.tuples(st.integers(1, 5), label_sets), max_size=12), st.integers(0, 40), st.integers(0, 40))
def test_history_agrees_with_a_list_of_appends(
    appends: list[tuple[int, LabelSet]], truncate: int, compact: int
) -> None:
    history, log = RegisterHistory(), [(0, EMPTY)]  # every append: (end offset, registers after it)
    for step, registers in appends:
        end = log[-1][0] + step
        history.record(end, registers)
        log.append((end, registers))

    def model_at(offset: int) -> LabelSet:
        return [registers for end, registers in log if end <= offset][-1]

    history.compact(compact)
    for offset in range(compact, 45):
        assert history.at(offset) == model_at(offset)
    if truncate >= compact:
        history.truncate_to(truncate)
        assert history.latest == model_at(truncate)
    assert decode_history(encode_history(history)) == history


# ------------------------------------------------------------------------------------------ checkpoint


def test_checkpoint_layout_and_round_trip(tmp_path: Path) -> None:
    history = RegisterHistory([(4100, ls("author=a")), (5000, ls("lock=", "author=b")), (6000, EMPTY)], floor=4096)
    assert encode_history(history).decode().splitlines()[:-1] == [
        "tidelog registers 1",
        "floor 4096",
        "3",
        "4100 author=a",
        "5000 author=b lock=",
        "6000",
    ]
    checkpoint = RegisterCheckpoint(tmp_path / "registers-checkpoint")
    assert checkpoint.read() is None
    checkpoint.write(history)
    assert checkpoint.read() == history
    checkpoint.write(RegisterHistory())
    assert checkpoint.read() == RegisterHistory()
    assert [p.name for p in tmp_path.iterdir()] == ["registers-checkpoint"]


def _with_crc(body: bytes) -> bytes:
    return body + f"crc32c {crc32c.crc32c(body):08x}\n".encode()


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"tidelog registers 2\nfloor 0\n0\n", "not a version 1 registers checkpoint"),
        (b"tidelog high-watermark 1\nfloor 0\n0\n", "not a version 1"),
        (b"tidelog registers 1\n0\n0\n", "no floor line"),
        (b"tidelog registers 1\nfloor 01\n0\n", "not an offset"),
        (b"tidelog registers 1\nfloor 0\n2\n10 ab=1\n", "1 entries where the header says 2"),
        (b"tidelog registers 1\nfloor 0\n1\n-10 ab=1\n", "not an offset"),
        (b"tidelog registers 1\nfloor 0\n1\n10 ab\n", "not a name=value"),
        (b"tidelog registers 1\nfloor 0\n1\n10 a=1\n", "bad label"),
        (b"tidelog registers 1\nfloor 0\n1\n10 ab=\xc3\xa9\n", "bad label"),
        (b"tidelog registers 1\nfloor 0\n1\n10 cd=1 ab=1\n", "canonical"),
        (b"tidelog registers 1\nfloor 0\n1\n10 ab=1 ab=1\n", "canonical"),
        (b"tidelog registers 1\nfloor 0\n1\n10 ab= ab=1\n", "both an empty"),
        (b"tidelog registers 1\nfloor 0\n1\n10  ab=1\n", "not a name=value"),
        (b"tidelog registers 1\nfloor 0\n2\n20 ab=1\n10 ab=2\n", "must increase"),
        (b"tidelog registers 1\nfloor 0\n2\n10 ab=1\n20 ab=1\n", "repeats"),
        (b"tidelog registers 1\nfloor 0\n1\n10 " + b" ".join(b"n%02d=" % i for i in range(65)) + b"\n", "65 labels"),
    ],
)
def test_checkpoint_refuses_bad_contents(body: bytes, fragment: str) -> None:
    with pytest.raises(CheckpointError, match=fragment):
        decode_history(_with_crc(body), path="f")


def test_checkpoint_refuses_a_bad_checksum_and_trailing_bytes() -> None:
    data = encode_history(RegisterHistory([(10, ls("ab=1"))]))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        decode_history(data.replace(b"ab=1", b"ab=2"))
    with pytest.raises(CheckpointError, match="malformed checksum line"):
        decode_history(data + b"x")
    with pytest.raises(CheckpointError, match="no checksum line"):
        decode_history(b"")


@settings(max_examples=200)
@given(st.data())
def test_any_damage_to_a_checkpoint_is_refused(data: st.DataObject) -> None:
    history = RegisterHistory([(10, ls("author=a", "lock=")), (20, ls("author=b"))], floor=5)
    encoded = bytearray(encode_history(history))
    position = data.draw(st.integers(0, len(encoded) - 1))
    replacement = data.draw(st.integers(0, 255).filter(lambda b: b != encoded[position]))
    damaged = bytes(encoded[:position]) + bytes([replacement]) + bytes(encoded[position + 1 :])
    with pytest.raises(CheckpointError):
        decode_history(damaged)
    with pytest.raises(CheckpointError):
        decode_history(bytes(encoded[:position]))


def test_checkpoint_file_damage_names_the_file() -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "registers-checkpoint"
        path.write_bytes(b"garbage")
        with pytest.raises(CheckpointError) as info:
            RegisterCheckpoint(path).read()
        assert info.value.path == str(path)
