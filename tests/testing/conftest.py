"""Options for the fault tests (``test_faults.py``): short runs by default, long ones on request.

Long runs take minutes per scenario (rounds of faults under load, three partitions); ask for them with
``pytest tests/testing/test_faults.py --fault-long`` or ``TIDELOG_FAULT_LONG=1 pytest ...``. The option is
declared here, so pytest knows it when this directory (or a file in it) is on the command line; the variable
works from anywhere, e.g. ``TIDELOG_FAULT_LONG=1 pytest tests``.
"""

from __future__ import annotations

import os

import pytest

from tidelog.testing.fault_run import FaultProfile

LONG_ENV = "TIDELOG_FAULT_LONG"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fault-long",
        action="store_true",
        default=False,
        help=f"run the fault scenarios for minutes with repeated faults (or set {LONG_ENV}=1)",
    )


def fault_long(config: pytest.Config) -> bool:
    """Whether long fault runs were asked for, by option or by environment."""
    option = bool(config.getoption("--fault-long", default=False))
    return option or os.environ.get(LONG_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


@pytest.fixture(scope="session")
def fault_profile(pytestconfig: pytest.Config) -> FaultProfile:
    """The profile every fault scenario runs with: :meth:`FaultProfile.short` unless long runs were asked for."""
    return FaultProfile.long() if fault_long(pytestconfig) else FaultProfile.short()
