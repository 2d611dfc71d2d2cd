"""A standalone Spark cluster on loopback — one master, N workers — from the scripts pyspark ships, for the tests
and the benchmark that run the data source outside the driver's process.

pyspark's wheel carries ``bin/spark-class`` (it has no ``sbin/start-master.sh``): ``spark-class
org.apache.spark.deploy.master.Master`` and ``...worker.Worker`` run the daemons in the foreground, and
``spark-class`` ends by ``exec``-ing the JVM, so the PID a :class:`~tidelog.launch.process.ManagedProcess` holds
is the daemon's own and stopping it by PID stops the daemon. Every port is a free one on 127.0.0.1
(``SPARK_LOCAL_IP``); logs and the workers' scratch directories go under ``root``. The master is ready when its web
UI answers; the cluster when the master's ``/json`` counts every worker alive.

Executors run this interpreter (``PYSPARK_PYTHON``) with this process's ``PYTHONPATH``, so they import the same
tidelog as the driver. A driver connects with :meth:`StandaloneSpark.session_config`: the master URL, one core per
executor (so each worker runs one executor), and the driver bound to loopback.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from importlib.util import find_spec
from pathlib import Path
from types import TracebackType

from tidelog.launch.ports import free_ports
from tidelog.launch.probes import http_get, http_probe
from tidelog.launch.process import ManagedProcess

START_WITHIN = 120.0
"""Seconds a daemon (a JVM) gets to come up, and the workers to register."""


def spark_home() -> Path:
    """The directory of the installed pyspark (its ``bin/spark-class`` and ``jars``)."""
    spec = find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise RuntimeError("pyspark is not installed (pip install '.[spark]')")
    return Path(spec.origin).parent


class StandaloneSpark:
    """One master and ``workers`` workers of ``cores`` cores each; an async context manager."""

    def __init__(self, root: Path, workers: int = 2, *, cores: int = 1, memory: str = "1g") -> None:
        self.root = root
        self.workers = workers
        self.cores = cores
        self.memory = memory
        port, ui, *worker_uis = free_ports(2 + workers)
        self.master_url = f"spark://127.0.0.1:{port}"
        self.ui_url = f"http://127.0.0.1:{ui}"
        home = spark_home()
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(root / "logs"),
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",  # its REST port is a fixed one (6066)
        }
        spark_class = str(home / "bin" / "spark-class")
        master = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port)]
        self._master = ManagedProcess(
            [spark_class, *master, "--webui-port", str(ui)],
            log_path=root / "master.log",
            name="spark-master",
            env=env,
        )
        worker = [
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            "127.0.0.1",
            "--cores",
            str(cores),
            "--memory",
            memory,
        ]
        self._workers = [
            ManagedProcess(
                [
                    spark_class,
                    *worker,
                    "--webui-port",
                    str(worker_ui),
                    "--work-dir",
                    str(root / f"work-{i}"),
                    self.master_url,
                ],
                log_path=root / f"worker-{i}.log",
                name=f"spark-worker-{i}",
                env=env,
            )
            for i, worker_ui in enumerate(worker_uis)
        ]

    @property
    def pids(self) -> list[int | None]:
        return [self._master.pid, *(w.pid for w in self._workers)]

    async def start(self) -> None:
        """Start the master, then the workers, and wait until the master counts them all alive."""
        try:
            await self._master.start(http_probe(self.ui_url + "/json/"), ready_within=START_WITHIN)
            await asyncio.gather(*(w.start(ready_within=START_WITHIN) for w in self._workers))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + START_WITHIN
            while await self.alive_workers() < self.workers:
                if loop.time() > deadline:
                    raise TimeoutError(f"{self.workers} Spark workers did not register within {START_WITHIN:.0f} s")
                await asyncio.sleep(0.2)
        except BaseException:
            await self.stop()
            raise

    async def alive_workers(self) -> int:
        try:
            status, body = await asyncio.wait_for(http_get(self.ui_url + "/json/"), 5)
        except (OSError, TimeoutError, ValueError):
            return 0
        return int(json.loads(body).get("aliveworkers", 0)) if status == 200 else 0

    async def stop(self) -> None:
        """Stop the workers, then the master, each by its PID."""
        await asyncio.gather(*(w.stop(grace=10) for w in self._workers))
        await self._master.stop(grace=10)

    async def __aenter__(self) -> StandaloneSpark:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def session_config(self) -> dict[str, str]:
        """What a driver sets to run on this cluster: one executor of ``cores`` cores per worker."""
        return {
            "spark.master": self.master_url,
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.cores": str(self.cores),
            "spark.cores.max": str(self.cores * self.workers),
            "spark.executor.memory": "512m",  # a worker offers ``memory``
            "spark.pyspark.python": sys.executable,
            "spark.executorEnv.PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        }
