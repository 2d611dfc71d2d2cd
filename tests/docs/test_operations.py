"""docs/grafana-dashboard.json and docs/operations.md name only metrics a broker exports, and the alert rules load.

The exported names come from a real broker's ``/metrics`` (a single broker is its own controller and holds the
``__cursors`` partition, so every family is there, with or without samples): a counter family ``x`` is scraped
as ``x_total``, a histogram as ``x_bucket``, ``x_sum`` and ``x_count``. Every PromQL expression of the dashboard
(panels and template variables) and of the example alert rules must name at least one metric, and every metric it
names must be one of those (or Prometheus's own ``up``). The alert rules must also pass ``promtool check rules``.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.broker.conftest import broker, broker_settings
from tests.helpers import BOUND
from tests.ui.helpers import get
from tidelog.server import Broker

__all__ = ["broker", "broker_settings"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

DOCS = Path(__file__).resolve().parents[2] / "docs"
METRIC = re.compile(r"\b((?:tidelog|process)_[a-z0-9_]+)\b")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


async def exported(broker: Broker) -> set[str]:
    assert broker.http is not None
    status, body = await get(f"http://127.0.0.1:{broker.http.port}/metrics")
    assert status == 200
    names = {"up"}
    for family in text_string_to_metric_families(body.decode()):
        names.update(family.name + s for s in SUFFIXES.get(family.type, ("",)))
    return names


def expressions(dashboard: dict[str, Any]) -> list[str]:
    found = []
    for panel in dashboard["panels"]:
        found.extend(target["expr"] for target in panel.get("targets", []))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found.append(variable["query"]["query"])
    return found


def alert_rules() -> str:
    text = (DOCS / "operations.md").read_text()
    match = re.search(r"<!-- alert-rules -->\n```yaml\n(.*?)```", text, re.DOTALL)
    assert match, "operations.md has no <!-- alert-rules --> yaml block"
    return match.group(1)


def unknown(expression: str, names: set[str]) -> list[str]:
    named = METRIC.findall(expression) + (["up"] if re.search(r"\bup\{", expression) else [])
    assert named, f"names no metric: {expression}"
    return [n for n in named if n not in names]


async def test_every_dashboard_expression_names_an_exported_metric(broker: Broker) -> None:
    names = await exported(broker)
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 30
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in dashboard["panels"]:
        assert {"type", "title", "gridPos"} <= panel.keys()
        assert panel["type"] == "row" or panel["targets"], panel["title"]
    found = expressions(dashboard)
    assert len(found) > 30
    bad = {e: unknown(e, names) for e in found if unknown(e, names)}
    assert not bad, f"expressions naming metrics no broker exports: {bad}"
    # The dashboard covers what the issue asks operators to see.
    joined = "\n".join(found)
    for wanted in ("tidelog_offline_partitions", "tidelog_broker_under_replicated_partitions",
                   "tidelog_follower_lag_records", "tidelog_consumer_lag_records",
                   "tidelog_request_duration_seconds_bucket", "tidelog_fsync_duration_seconds_bucket"):  # fmt: skip
        assert wanted in joined, wanted


async def test_the_example_alert_rules_load_and_name_exported_metrics(broker: Broker, tmp_path: Path) -> None:
    names = await exported(broker)
    rules = alert_rules()
    exprs = re.findall(r"expr: (.*?)\n\s+for:", rules, re.DOTALL)
    assert len(exprs) >= 8
    bad = {e: unknown(e, names) for e in exprs if unknown(e, names)}
    assert not bad, f"alert expressions naming metrics no broker exports: {bad}"
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed (it comes with Debian's prometheus: `make system-deps`)")
    path = tmp_path / "tidelog-rules.yml"
    path.write_text(rules)

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=BOUND)

    result = await asyncio.to_thread(check)
    assert result.returncode == 0, result.stdout + result.stderr
