"""The register history (registers by log end offset: truncation, compaction) and its checkpoint file."""

from __future__ import annotations

import tempfile
from pathlib import Path

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.protocol.labels import EMPTY, MAX_REGISTER_LABELS, LabelSet, RegisterLimitError
from tidelog.replication.idempotence.register_history import (
    RegisterCheckpoint,
    RegisterHistory,
    decode_history,
    encode_history,
)
from tidelog.storage.errors import CheckpointError


def ls(*labels: str) -> LabelSet:
    """``ls("a=1", "b=")``: a label set from ``name=value`` strings."""
    return LabelSet(tuple(text.split("=", 1)) for text in labels)  # type: ignore[misc]


def _valid(pairs: list[tuple[str, str]]) -> LabelSet:
    """Drop pairs that would give a name both the empty and other values, then build the set."""
    by_name: dict[str, set[str]] = {}
    for name, value in pairs:
        by_name.setdefault(name, set()).add(value)
    return LabelSet([(n, v) for n, vs in by_name.items() for v in vs if v or len(vs) == 1])


names = st.sampled_from(["ab", "author", "lock", "x.y", "zz"])
values = st.sampled_from(["", "1", "2", "a", "b-c"])
label_sets = st.lists(st.tuples(names, values), max_size=8).map(_valid)


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
