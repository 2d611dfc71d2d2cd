"""The web cluster view at ``/``: one server-rendered page, its fragments, its chart data and its static files.

The page is plain HTML with every table in it (:mod:`tidelog.ui.fragments`), so it reads the same with
JavaScript off. With JavaScript on, htmx reloads each table in place, and ``tidelog-view.js`` draws two uPlot
charts (throughput, replication lag) from ``/api/series`` (:mod:`tidelog.ui.series`). htmx and uPlot are vendored
in ``static/`` at pinned versions, with their licences: the view loads nothing from elsewhere.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from tidelog.ui.changes import RecentChanges
from tidelog.ui.fragments import FRAGMENTS
from tidelog.ui.series import Series
from tidelog.ui.view import BrokerView

__all__ = ["HTMX", "STATIC", "UPLOT", "page", "routes"]

STATIC = Path(__file__).parent / "static"
HTMX = "htmx-2.0.11.min.js"
UPLOT = "uPlot-1.6.32.iife.min.js"
UPLOT_CSS = "uPlot-1.6.32.min.css"

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #1d2330; background: #fafbfc; }
header { display: flex; gap: 1.5rem; align-items: baseline; }
h1 { font-size: 1.4rem; margin: 0 0 1rem 0; }
table { border-collapse: collapse; margin: 0 0 1.5rem 0; font-size: 0.9rem; }
caption { text-align: left; font-weight: 600; padding: 0.3rem 0; }
th, td { border: 1px solid #d0d5dd; padding: 0.25rem 0.6rem; text-align: left; }
th { background: #eef1f5; }
td.empty { color: #6b7280; font-style: italic; }
.charts { display: flex; flex-wrap: wrap; gap: 1.5rem; margin-bottom: 1.5rem; }
.chart { background: #fff; border: 1px solid #d0d5dd; padding: 0.5rem; min-width: 480px; min-height: 260px; }
"""


def page(view: BrokerView, changes: RecentChanges) -> str:
    """The whole page, every table filled in."""
    tables = "".join(render(view, changes) for render in FRAGMENTS.values())
    title = f"tidelog — broker {escape(view.broker_id)}"
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<link rel="stylesheet" href="/static/{UPLOT_CSS}">
<style>{_STYLE}</style>
<script src="/static/{HTMX}" defer></script>
<script src="/static/{UPLOT}" defer></script>
<script src="/static/tidelog-view.js" defer></script>
</head>
<body>
<header><h1>{title}</h1><a href="/metrics">/metrics</a><a href="/readyz">/readyz</a></header>
<div class="charts">
<div class="chart" id="chart-throughput" data-title="Records written per second (partitions led here)"></div>
<div class="chart" id="chart-lag" data-title="Largest follower lag (records)"></div>
</div>
<noscript><p>JavaScript is off: the tables below show the state when the page was loaded.</p></noscript>
{tables}
</body>
</html>
"""


def routes(view: BrokerView) -> list[BaseRoute]:
    """``/``, ``/fragments/<name>``, ``/api/series`` and ``/static``; starts listening to the metadata mirror."""
    changes = RecentChanges()
    view.mirror.add_listener(changes.listener)
    series = Series(view)

    async def index(_request: Request) -> Response:
        series.sample()  # the charts start from the page's first load
        return HTMLResponse(page(view, changes))

    async def fragment(request: Request) -> Response:
        render = FRAGMENTS.get(request.path_params["name"])
        if render is None:
            names = ", ".join(FRAGMENTS)
            return Response(f"no such fragment; the fragments are {names}\n", status_code=404)
        return HTMLResponse(render(view, changes))

    async def api_series(_request: Request) -> Response:
        return JSONResponse(series.columns())

    return [
        Route("/", index, methods=["GET"]),
        Route("/fragments/{name}", fragment, methods=["GET"]),
        Route("/api/series", api_series, methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
