"""The pushed instruments: Prometheus histogram semantics (cumulative ``le`` buckets, sum, count) and the off switch."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tidelog import telemetry


@pytest.fixture(autouse=True)
def counting() -> Iterator[None]:
    telemetry.set_enabled(True)
    yield
    telemetry.set_enabled(True)


def samples(name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = generate_latest(telemetry.REGISTRY).decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def test_a_histogram_counts_each_value_in_the_first_bucket_at_or_above_it_cumulatively() -> None:
    observe = telemetry.request_observer("wire", "test_op")
    for seconds in (0.001, 0.001, 0.003, 20.0):  # 0.001 is a bound: it counts in le="0.001"
        observe(seconds)
    buckets = {dict(k)["le"]: v for k, v in samples("tidelog_request_duration_seconds_bucket").items()
               if dict(k)["operation"] == "test_op"}  # fmt: skip
    assert buckets["0.0005"] == 0 and buckets["0.001"] == 2 and buckets["0.0025"] == 2 and buckets["0.005"] == 3
    assert buckets["10.0"] == 3 and buckets["+Inf"] == 4
    key = (("operation", "test_op"), ("protocol", "wire"))
    assert samples("tidelog_request_duration_seconds_count")[key] == 4
    assert samples("tidelog_request_duration_seconds_sum")[key] == pytest.approx(20.005)


def test_nothing_is_counted_while_off() -> None:
    before = samples("tidelog_fsynced_bytes_total")[()]
    telemetry.set_enabled(False)
    telemetry.fsynced(1_000_000, 3, 4096)
    assert samples("tidelog_fsynced_bytes_total")[()] == before
    telemetry.set_enabled(True)
    telemetry.fsynced(1_000_000, 3, 4096)
    assert samples("tidelog_fsynced_bytes_total")[()] == before + 4096
