"""The data source on a standalone Spark cluster — a master and two workers started from pyspark's own
``spark-class`` on loopback (:class:`~tidelog.spark.standalone.StandaloneSpark`), stopped by PID — so the source's
tasks and the sink's appends run in executors, outside the driver's process: the example pipeline, and the sink's
crash test where every task's first attempt fails after appending and Spark retries it on an executor.

The driver runs in a process of its own (:mod:`tests.spark.standalone_driver`): this one already holds the
session's ``local[2]`` SparkContext, and a process has only one.

CI runs the reduced form: the crash test alone (about a minute with the cluster's start). The example pipeline
on the cluster is marked ``spark_cluster``, which ``pytest`` deselects unless asked: ``pytest -m spark_cluster
tests/spark/test_standalone.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from tidelog.client import LoopThread
from tidelog.local.serve_process import ServedBroker
from tidelog.spark.standalone import START_WITHIN, StandaloneSpark

pytestmark = pytest.mark.slow

REPOSITORY = Path(__file__).resolve().parents[2]
DRIVER_TIMEOUT = 300.0


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneSpark]:
    runner = LoopThread("spark-standalone")
    cluster = StandaloneSpark(tmp_path_factory.mktemp("spark-standalone"), workers=2)
    try:
        runner.run(cluster.start(), timeout=START_WITHIN * 3)
        yield cluster
    finally:
        runner.run(cluster.stop(), timeout=60)
        runner.close()


def drive(standalone: StandaloneSpark, served: ServedBroker, workdir: Path, part: str) -> dict[str, Any]:
    """Run ``part`` of :mod:`tests.spark.standalone_driver` on the cluster; what it saw."""
    job = {
        "config": standalone.session_config(),
        "brokers": served.wire_address,
        "nats_url": served.nats_url,
        "prefix": f"standalone-{part}",
        "workdir": str(workdir),
        "parts": [part],
    }
    paths = [str(REPOSITORY), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.standalone_driver", json.dumps(job)],
        cwd=REPOSITORY,
        env=env,
        capture_output=True,
        timeout=DRIVER_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-6000:]
    seen: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert seen["executors"] == 2
    return seen


def test_a_sink_crash_is_retried_on_two_executors_and_written_once(
    standalone: StandaloneSpark, served: ServedBroker, tmp_path: Path
) -> None:
    crash = drive(standalone, served, tmp_path, "crash")["crash"]
    assert crash["rows"] == 60 and crash["batches"] == [0]  # retried tasks, one micro-batch


@pytest.mark.spark_cluster
def test_the_example_pipeline_runs_on_two_executors(
    standalone: StandaloneSpark, served: ServedBroker, tmp_path: Path
) -> None:
    sensors = drive(standalone, served, tmp_path, "example")["example"]
    assert sensors == {sensor: 20 for sensor in sensors} and len(sensors) == 5
