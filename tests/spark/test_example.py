"""``examples/nats_to_spark_to_tidelog.py`` end to end, on the session's broker and Spark: NATS messages in,
per-sensor statistics out through the exactly-once sink, and a second run that continues from the checkpoint."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

pytest.importorskip("pyspark")

from tidelog.client import TidelogClient
from tidelog.local.serve_process import ServedBroker

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "nats_to_spark_to_tidelog.py"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("nats_to_spark_to_tidelog", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_the_example_pipeline_counts_every_nats_message_once(
    example: ModuleType,
    spark: SparkSession,
    served: ServedBroker,
    client: TidelogClient,
    stream_name: str,
    tmp_path: Path,
) -> None:
    endpoints = example.Endpoints(served.wire_address, served.nats_url)
    pipeline = example.Pipeline(
        readings=stream_name + "-readings", stats=stream_name + "-stats", messages=250, checkpoint=tmp_path / "cp"
    )
    sensors = len(example.SENSORS)
    first = example.run_pipeline(spark, endpoints, pipeline)
    assert sorted((s.sensor, s.readings) for s in first) == sorted((name, 50) for name in example.SENSORS)
    for stat in first:  # readings are drawn within ±2 °C of 20 + 5 × the sensor's index
        assert abs(stat.mean_celsius - (20 + 5 * example.SENSORS.index(stat.sensor))) < 2

    second = example.run_pipeline(spark, endpoints, pipeline)  # 250 more, from the same checkpoint
    assert sorted((s.sensor, s.readings) for s in second) == sorted((name, 100) for name in example.SENSORS)
    with client.consumer(pipeline.stats, stop_at_end=True) as consumer:
        keys = [record.key for record in consumer]
    assert len(keys) == 2 * sensors  # one complete table per run: each micro-batch appended once
