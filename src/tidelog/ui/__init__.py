"""The broker's HTTP port (``http_port``, 9294): Prometheus metrics, health endpoints and the web cluster view.

The server (:mod:`tidelog.server`) builds a :class:`~tidelog.ui.view.BrokerView` of its running parts and starts
an :class:`~tidelog.ui.http_server.HttpServer` serving the Starlette app of :mod:`tidelog.ui.routes` — the one
module where routes are assembled — inside the broker's event loop.

- :mod:`tidelog.ui.collectors`: metrics read from the broker's state at scrape time (offsets, high watermarks,
  ISRs, follower lag, NATS ingest counts, consumer-group lag): nothing counted on the write path. Events that
  leave no state (request and fsync latencies, ISR changes, elections) are counted by :mod:`tidelog.telemetry`,
  below every layer.
- :mod:`tidelog.ui.health`: ``/healthz`` (alive) and ``/readyz`` (registered, metadata in sync, NATS and etcd
  reachable), with a JSON body saying what is not ready.
- The web cluster view at ``/``: :mod:`tidelog.ui.pages` (the page, its routes, the vendored htmx and uPlot in
  ``static/``), :mod:`tidelog.ui.fragments` (its tables, each refreshed in place by htmx),
  :mod:`tidelog.ui.series` (``/api/series``: throughput and lag history for the charts, from the collectors'
  families) and :mod:`tidelog.ui.changes` (recent metadata changes, from the mirror).

This package reads the broker and never changes it. It sits beside :mod:`tidelog.api` in the layers.
"""
