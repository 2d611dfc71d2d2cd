"""Reading a broker's HTTP port from tests: GET a path, parse the Prometheus text format into samples."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import BOUND

Labels = frozenset[tuple[str, str]]


async def get(url: str) -> tuple[int, bytes]:
    """``GET url``: (status, body), in a thread (urllib blocks); an HTTP error status is an answer, not a failure."""

    def fetch() -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(url, timeout=BOUND) as response:
                return int(response.status), bytes(response.read())
        except urllib.error.HTTPError as error:
            return int(error.code), bytes(error.read())

    return await asyncio.to_thread(fetch)


async def get_json(url: str) -> tuple[int, Any]:
    status, body = await get(url)
    return status, json.loads(body)


async def scrape(base: str) -> dict[str, dict[Labels, float]]:
    """``/metrics`` of the broker at ``base`` as sample name → {labels → value}."""
    status, body = await get(f"{base}/metrics")
    assert status == 200, body[:500]
    samples: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return samples


def value(samples: dict[str, dict[Labels, float]], name: str, **labels: str) -> float | None:
    """The sample ``name`` whose labels include ``labels`` (exactly one must match); None when none does."""
    found = [v for key, v in samples.get(name, {}).items() if set(labels.items()) <= key]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None
