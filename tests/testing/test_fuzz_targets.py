"""The committed fuzz corpus (``fuzz/corpus/<target>/``) replayed through every decoder, and the layout of
``fuzz/`` kept in step with the targets: one atheris script and one corpus per target, every seed in it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.testing.fuzz_contract import ContractViolation, Target, check, corpus_files, corpus_name, replay, run
from tidelog.testing.fuzz_targets import TARGETS

FUZZ_DIR = Path(__file__).resolve().parents[2] / "fuzz"


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_the_corpus_replays_within_the_contract(name: str) -> None:
    assert replay(TARGETS[name], FUZZ_DIR / "corpus" / name) > 0


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_target_has_a_script_and_its_seeds_in_the_corpus(name: str) -> None:
    assert (FUZZ_DIR / f"fuzz_{name}.py").is_file()
    committed = {path.name for path in corpus_files(FUZZ_DIR / "corpus" / name)}
    missing = [corpus_name(seed) for seed in TARGETS[name].seeds() if corpus_name(seed) not in committed]
    assert not missing, f"run: python -m tidelog.testing.fuzz_targets write-corpus fuzz/corpus --target {name}"


def _raises(exc: Exception) -> Target:
    def decode(data: bytes) -> None:
        raise exc

    return Target("broken", decode, ValueError, list)


def test_another_exception_breaks_the_contract() -> None:
    run(_raises(ValueError("expected")), b"x")
    with pytest.raises(ContractViolation, match="raised IndexError"):
        run(_raises(IndexError("oops")), b"x")


def test_an_allocation_beyond_the_bound_breaks_the_contract() -> None:
    greedy = Target("greedy", lambda data: bytearray(4 << 20), ValueError, list, allocation_factor=1)
    with pytest.raises(ContractViolation, match="allocated"):
        check(greedy, b"small")
