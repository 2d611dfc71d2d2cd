"""The data source on a standalone Spark cluster — a master and two workers started from pyspark's own
``spark-class`` on loopback (:class:`~tidelog.spark.standalone.StandaloneSpark`), stopped by PID — so the source's
tasks and the sink's appends run in executors, outside the driver's process: the example pipeline, and the sink's
crash points — tasks whose first attempts fail after appending (Spark retries them on an executor), a driver
killed after the sink's commit and before Spark's, a driver that died in the middle of a micro-batch — each
replayed to exactly one copy of every row.

The driver runs in a process of its own (:mod:`tests.spark.standalone_driver`): this one already holds the
session's ``local[2]`` SparkContext, and a process has only one. The cluster is started once for the module.

CI runs the crash points: two driver processes (applications) on the one cluster — the driver that is killed,
with one short query, and one for everything else. The example pipeline on the cluster is marked
``spark_cluster``, which ``pytest`` deselects unless asked: ``pytest -m spark_cluster tests/spark/test_standalone.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from tidelog.client import LoopThread, TidelogClient
from tidelog.local.serve_process import ServedBroker
from tidelog.spark.standalone import START_WITHIN, StandaloneSpark

pytestmark = pytest.mark.slow

REPOSITORY = Path(__file__).resolve().parents[2]
DRIVER_TIMEOUT = 900.0  # a bound for a loaded machine


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


def drive(
    standalone: StandaloneSpark, served: ServedBroker, workdir: Path, *parts: str, killed: bool = False
) -> dict[str, Any]:
    """Run ``parts`` of :mod:`tests.spark.standalone_driver` in one driver process on the cluster; what it saw
    (``killed``: the driver process must die by SIGKILL, and nothing is returned)."""
    job = {
        "config": standalone.session_config(),
        "brokers": served.wire_address,
        "nats_url": served.nats_url,
        "prefix": "standalone",
        "workdir": str(workdir),
        "parts": list(parts),
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
    if killed:
        assert done.returncode == -signal.SIGKILL, done.stderr.decode(errors="replace")[-6000:]
        return {}
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-6000:]
    seen: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert seen["executors"] == 2
    return seen


def test_every_crash_point_of_the_sink_writes_each_row_once_on_two_executors(
    standalone: StandaloneSpark, served: ServedBroker, tmp_path: Path
) -> None:
    """The driver killed after the sink's commit of micro-batch 0 (its appends are in, Spark's commit log lacks
    it); then, in a second driver: tasks retried after appending, the killed query restarted, and a crash in the
    middle of a micro-batch (see :mod:`tests.spark.standalone_driver`)."""
    drive(standalone, served, tmp_path, "killed", killed=True)
    checkpoint = tmp_path / "killed"
    assert (checkpoint / "offsets" / "0").exists() and not (checkpoint / "commits" / "0").exists()
    with TidelogClient(served.wire_address) as client:
        assert sum(p.high_watermark for p in client.admin.describe_stream("standalone-killed-out").partitions) == 20
    seen = drive(standalone, served, tmp_path, "crash", "driver_crashes")
    assert seen["crash"]["rows"] == 60 and seen["crash"]["batches"] == [0]  # retried tasks, one micro-batch
    crashes = seen["driver_crashes"]
    assert crashes["restarted"] == {"0": 20, "1": 20}  # micro-batch 0 run again: the sink wrote nothing of it
    assert crashes["completed"] == {"2": 10} and crashes["rows"] == 50  # each row once


@pytest.mark.spark_cluster
def test_the_example_pipeline_runs_on_two_executors(
    standalone: StandaloneSpark, served: ServedBroker, tmp_path: Path
) -> None:
    sensors = drive(standalone, served, tmp_path, "example")["example"]
    assert sensors == {sensor: 20 for sensor in sensors} and len(sensors) == 5
