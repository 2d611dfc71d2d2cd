"""``/readyz`` follows what the broker depends on: ready with etcd, not ready (saying why) once etcd is gone."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.broker.conftest import broker_config
from tests.helpers import BOUND
from tests.ui.helpers import get_json
from tidelog.server import Broker

pytestmark = pytest.mark.slow


async def test_readyz_names_etcd_once_it_stops_and_healthz_stays_ok(tmp_path: Path) -> None:
    broker = Broker(broker_config(tmp_path / "b", broker_lease_ttl_ms=2000))
    await broker.start()
    try:
        assert broker.http is not None and broker.embedded_etcd is not None
        base = f"http://127.0.0.1:{broker.http.port}"
        status, body = await get_json(f"{base}/readyz")
        assert status == 200 and body["not_ready"] == [], body

        await broker.embedded_etcd.stop()
        for _ in range(int(BOUND * 4)):  # bounded: each probe waits up to a second for etcd
            status, body = await get_json(f"{base}/readyz")
            if status == 503 and "etcd" in body["not_ready"]:
                break
        assert status == 503, body
        assert "etcd" in body["not_ready"]
        assert body["status"] == "not ready"
        assert body["checks"]["etcd"]["ok"] is False and body["checks"]["etcd"]["detail"]
        assert body["checks"]["nats"]["ok"] is True  # only what failed is named
        assert await get_json(f"{base}/healthz") == (200, {"status": "ok", "broker": broker.id})
    finally:
        await broker.stop()
