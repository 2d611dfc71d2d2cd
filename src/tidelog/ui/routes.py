"""The broker's HTTP application: every route of the HTTP port, assembled here and nowhere else.

``/metrics`` (Prometheus text format: the broker's scrape-time collectors, the process-wide pushed instruments
of :mod:`tidelog.telemetry`, and the process's CPU, memory and file descriptors), ``/healthz`` and ``/readyz``
(:mod:`tidelog.ui.health`), and the web cluster view (``/``, its fragments, ``/api/series`` and ``/static``:
:mod:`tidelog.ui.pages`).

``metrics_enabled = false`` leaves ``/metrics`` out (404), so a scraper learns at once that it is off.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from tidelog import telemetry
from tidelog.ui import pages
from tidelog.ui.collectors import BrokerCollector
from tidelog.ui.health import liveness, readiness
from tidelog.ui.view import BrokerView

__all__ = ["build_app", "broker_registry", "routes"]


def broker_registry(view: BrokerView) -> CollectorRegistry:
    """The broker's own registry: its state collector and the process collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(view))
    ProcessCollector(registry=registry)
    return registry


def scrape(registry: CollectorRegistry) -> bytes:
    """One scrape: the broker's families, then the pushed instruments."""
    return generate_latest(registry) + generate_latest(telemetry.REGISTRY)


def routes(view: BrokerView) -> list[BaseRoute]:
    """Every route of the HTTP port."""
    registry = broker_registry(view)

    async def metrics(_request: Request) -> Response:
        return Response(scrape(registry), media_type=CONTENT_TYPE_LATEST)

    async def healthz(_request: Request) -> Response:
        return JSONResponse(liveness(view))

    async def readyz(_request: Request) -> Response:
        ready, body = await readiness(view)
        return JSONResponse(body, status_code=200 if ready else 503)

    found: list[BaseRoute] = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]
    if view.config.metrics_enabled:
        found.append(Route("/metrics", metrics, methods=["GET"]))
    found.extend(pages.routes(view))
    return found


def build_app(view: BrokerView) -> Starlette:
    return Starlette(routes=routes(view))
