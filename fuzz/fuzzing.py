"""What every atheris script in this directory shares: run one tidelog fuzz target under libFuzzer.

The decoders and their contract live in the package (:mod:`tidelog.testing.fuzz_targets`,
:mod:`tidelog.testing.fuzz_contract`), so Hypothesis, the CI corpus replay and atheris check the same thing; a
script here only names its target. ``make fuzz`` runs each for ``FUZZ_TIME`` seconds; by hand::

    PYTHONPATH=src .venv/bin/python fuzz/fuzz_wire_frames.py .fuzz/wire_frames fuzz/corpus/wire_frames \\
        -max_total_time=600 -timeout=10 -rss_limit_mb=2048

libFuzzer writes new inputs into the first directory (keep it out of the repository) and reads the committed
corpus from the second. A contract violation is an ``AssertionError``: atheris reports it as a crash and saves the
input. Set ``TIDELOG_FUZZ_MEASURE=1`` to check every input's peak allocation with tracemalloc too (several
times slower; without it, ``-rss_limit_mb`` is the allocation bound).
"""

from __future__ import annotations

import logging
import os
import sys
from types import ModuleType

import atheris


def fuzz(name: str) -> None:
    """Fuzz the target ``name`` with the command line's libFuzzer arguments (never returns normally)."""
    with atheris.instrument_imports(include=["tidelog"]):
        from tidelog.testing import fuzz_contract, fuzz_targets
    target = fuzz_targets.TARGETS[name]
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
    os.environ.setdefault("TIDELOG_FUZZ_SCRATCH", f"{shm}/tidelog-fuzz-{name}")  # one per target, reused
    logging.disable(logging.CRITICAL)  # recovery logs every cut it makes: thousands of lines a second
    measure = os.environ.get("TIDELOG_FUZZ_MEASURE") == "1"
    contract: ModuleType = fuzz_contract

    def one_input(data: bytes) -> None:
        if measure:
            contract.check(target, data)
        else:
            contract.run(target, data)

    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
