"""A real local Spark (``local[2]``) and a real broker, each started once for the whole test session.

Spark's Python workers (the tasks, and the driver-side planner processes of the data source) are separate
processes that connect to the broker over loopback, so the broker runs as ``tidelog serve`` in a child process
(:mod:`tidelog.local.serve_process`), started from a loop thread that lives as long as the session (the child
is tied to that thread: it dies with it, see :mod:`tidelog.launch.process`) and stopped by its PID.

The SparkSession is kept small (1 GiB driver, two shuffle partitions, no UI). Its workers run this
interpreter (``PYSPARK_PYTHON`` and ``spark.pyspark.python``): another one would not find tidelog.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from tidelog.client import LoopThread, TidelogClient
from tidelog.local.serve_process import ServedBroker, start_served_broker

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def broker_thread() -> Iterator[LoopThread]:
    runner = LoopThread("spark-tests-broker")
    yield runner
    runner.close()


@pytest.fixture(scope="session")
def served(broker_thread: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedBroker]:
    workdir: Path = tmp_path_factory.mktemp("spark-broker")
    broker = broker_thread.run(start_served_broker(workdir), timeout=120)
    yield broker
    broker_thread.run(broker.stop(), timeout=60)


@pytest.fixture(scope="session")
def brokers(served: ServedBroker) -> str:
    """The ``brokers`` option: the served broker's wire address."""
    return served.wire_address


@pytest.fixture(scope="session")
def client(brokers: str) -> Iterator[TidelogClient]:
    with TidelogClient(brokers) as tidelog:
        yield tidelog


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from pyspark.sql import SparkSession

    # The workers that look data sources up by name (finding pyspark_tidelog) run PYSPARK_PYTHON, whatever
    # spark.pyspark.python says.
    saved = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("tidelog-tests")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    if saved is None:
        del os.environ["PYSPARK_PYTHON"]
    else:
        os.environ["PYSPARK_PYTHON"] = saved


@pytest.fixture
def stream_name(request: pytest.FixtureRequest) -> str:
    """A stream name (and NATS subject) of this test's own, so tests sharing the broker never collide."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name).strip("-")[:100]
