"""The web cluster view in a real headless browser: Debian's chromium driven by Playwright (``executable_path``).

A broker holds a stream of two partitions that a producer keeps writing to while the browser loads ``/``: the
page must show the broker's row and one row per partition, the throughput chart must be drawn from
``/api/series``, a screenshot must be a real picture, and with JavaScript off the tables must still be there.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.broker.conftest import broker, broker_settings, stub
from tests.broker.helpers import Stub, create_stream, producing
from tests.helpers import BOUND, LONG_BOUND
from tests.ui.helpers import get, get_json
from tidelog.client.admin import Admin
from tidelog.client.producer import Producer
from tidelog.local.cluster import LocalCluster
from tidelog.server import Broker

__all__ = ["broker", "broker_settings", "stub"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHROMIUM = shutil.which("chromium")
STREAM = "viewed"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def base_url(broker: Broker) -> str:
    assert broker.http is not None
    return f"http://127.0.0.1:{broker.http.port}"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def under_load(broker: Broker, stub: Stub) -> AsyncIterator[str]:
    """A stream of two partitions with a producer writing to both until the module's tests end."""
    await create_stream(stub, STREAM, partitions=2)
    async with producing(broker, STREAM, b"x" * 100):
        yield STREAM


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def browser() -> AsyncIterator[object]:
    if CHROMIUM is None:
        pytest.fail("Debian's chromium is not installed (installed by `make system-deps`)")
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            await launched.close()


async def test_the_page_shows_brokers_partitions_and_a_drawn_chart(
    broker: Broker, under_load: str, browser: object, tmp_path: Path
) -> None:
    page = await browser.new_page(viewport={"width": 1280, "height": 1000})  # type: ignore[attr-defined]
    await page.goto(base_url(broker) + "/", timeout=BOUND * 1000)
    broker_rows = page.locator("#brokers tbody tr")
    assert await broker_rows.count() == 1
    assert broker.id in await broker_rows.first.inner_text()
    assert "controller" in await broker_rows.first.inner_text()
    rows = page.locator("#partitions tbody tr", has_text=under_load)
    assert await rows.count() == 2
    cells = await rows.first.locator("td").all_inner_texts()
    assert cells[:5] == [under_load, "0", broker.id, broker.id, broker.id]
    assert int(cells[6]) > 0  # log end: the producer has written
    # The chart: uPlot holds points from /api/series and has painted pixels on its canvas.
    await page.wait_for_function("window.tidelogChartPoints >= 2", timeout=BOUND * 1000)
    series = await page.evaluate("window.tidelogCharts.throughput.series.length")
    assert series == 2
    points = await page.evaluate("Math.max(...window.tidelogCharts.throughput.data[1])")
    assert points > 0
    painted = await page.evaluate(
        """() => {
            const canvas = document.querySelector('#chart-throughput canvas');
            const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
            let count = 0;
            for (let i = 3; i < pixels.length; i += 4) if (pixels[i] !== 0) count++;
            return count;
        }"""
    )
    assert painted > 1000
    shot = tmp_path / "cluster-view.png"
    await page.screenshot(path=str(shot), full_page=True)
    data = shot.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 20_000
    # htmx swaps the tables in place: the partitions table is still there, with fresher offsets.
    fresher = f"""() => {{
        const row = [...document.querySelectorAll('#partitions tbody tr')]
            .find(r => r.cells[0].innerText === '{under_load}' && r.cells[1].innerText === '0');
        return row !== undefined && Number(row.cells[6].innerText) > {int(cells[6])};
    }}"""
    await page.wait_for_function(fresher, timeout=BOUND * 1000)
    await page.close()


async def test_with_javascript_off_the_tables_are_still_there(broker: Broker, under_load: str, browser: object) -> None:
    context = await browser.new_context(java_script_enabled=False)  # type: ignore[attr-defined]
    page = await context.new_page()
    await page.goto(base_url(broker) + "/", timeout=BOUND * 1000)
    assert await page.locator("#brokers tbody tr").count() == 1
    assert await page.locator("#partitions tbody tr", has_text=under_load).count() == 2
    assert await page.locator("#groups table").count() == 2
    assert await page.locator("#activity table").count() == 1
    await context.close()


async def test_fragments_series_and_static_files_answer(broker: Broker, under_load: str) -> None:
    base = base_url(broker)
    status, body = await get(f"{base}/fragments/partitions")
    assert status == 200 and body.startswith(b'<section id="partitions"') and under_load.encode() in body
    status, body = await get(f"{base}/fragments/nonesuch")
    assert status == 404 and b"the fragments are brokers, partitions, groups, activity" in body
    status, columns = await get_json(f"{base}/api/series")
    assert status == 200
    assert set(columns) == {"t", "records_per_second", "bytes_per_second", "max_lag_records", "max_lag_seconds"}
    assert len({len(v) for v in columns.values()}) == 1
    for name in ("htmx-2.0.11.min.js", "uPlot-1.6.32.iife.min.js", "htmx-LICENSE", "uPlot-LICENSE"):
        status, body = await get(f"{base}/static/{name}")
        assert status == 200 and len(body) > 500, name


@pytest.mark.slow
async def test_a_three_broker_cluster_losing_a_broker(browser: object, tmp_path: Path) -> None:
    """Three brokers, a stream of three replicas under load: every broker and replica is shown, the lag chart is
    drawn, and once a follower's broker is killed the refreshed tables say so without reloading the page."""
    settings = {"broker_lease_ttl_ms": "2000", "replica_lag_time_max_ms": "3000"}
    async with LocalCluster(tmp_path / "cluster", 3, settings=settings) as cluster:
        async with Admin(cluster.bootstrap()) as admin:
            await admin.create_stream("replicated", partitions=2, replication_factor=3)
            await admin.describe_stream("replicated")
        stop = asyncio.Event()

        async def produce() -> None:
            async with Producer(cluster.bootstrap()) as producer:
                for i in range(1_000_000):  # a bound, not a target: the test stops it long before
                    if stop.is_set():
                        return
                    await producer.send("replicated", b"r" * 100, partition=i % 2)
                    if i % 100 == 99:
                        await producer.flush()

        load = asyncio.create_task(produce())
        try:
            controller = await cluster.controller_id()
            watched = next(b for b in cluster.brokers if b.id == controller)
            victim = next(b for b in cluster.brokers if b.id != controller)
            page = await browser.new_page(viewport={"width": 1400, "height": 1100})  # type: ignore[attr-defined]
            await page.goto(f"{watched.http_url}/", timeout=LONG_BOUND * 1000)
            assert await page.locator("#brokers tbody tr").count() == 3
            assert await page.locator("#brokers tbody tr", has_text="controller").count() == 1
            rows = page.locator("#partitions tbody tr", has_text="replicated")
            assert await rows.count() == 2
            for i in range(2):
                cells = await rows.nth(i).locator("td").all_inner_texts()
                assert len(cells[3].split(", ")) == 3  # replicas
            await page.wait_for_function("window.tidelogChartPoints >= 2", timeout=LONG_BOUND * 1000)
            assert await page.evaluate("window.tidelogCharts.lag.series.length") == 2
            await cluster.kill(victim.id)
            gone = f"""() => [...document.querySelectorAll('#brokers tbody tr')]
                .some(r => r.innerText.includes('{victim.id}') && r.innerText.includes('offline'))"""
            await page.wait_for_function(gone, timeout=LONG_BOUND * 1000)
            shrunk = """() => [...document.querySelectorAll('#partitions tbody tr')]
                .filter(r => r.cells[0].innerText === 'replicated')
                .every(r => r.cells[8].innerText.includes('under-replicated'))"""
            await page.wait_for_function(shrunk, timeout=LONG_BOUND * 1000)
            left = page.locator("#activity tbody tr", has_text=f"broker {victim.id}")
            assert "left" in await left.first.inner_text()
            shot = tmp_path / "three-brokers.png"
            await page.screenshot(path=str(shot), full_page=True)
            assert shot.read_bytes().startswith(PNG_MAGIC)
            await page.close()
        finally:
            stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(load, LONG_BOUND)
