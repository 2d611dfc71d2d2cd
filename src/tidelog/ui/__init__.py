"""The broker's HTTP port (``http_port``, 9294): Prometheus metrics, health endpoints, and later the web view.

The server (:mod:`tidelog.server`) builds a :class:`~tidelog.ui.view.BrokerView` of its running parts and starts
an :class:`~tidelog.ui.http_server.HttpServer` serving the Starlette app of :mod:`tidelog.ui.routes` — the one
module where routes are assembled — inside the broker's event loop.

- :mod:`tidelog.ui.collectors`: metrics read from the broker's state at scrape time (offsets, high watermarks,
  ISRs, follower lag, NATS ingest counts, consumer-group lag): nothing counted on the write path. Events that
  leave no state (request and fsync latencies, ISR changes, elections) are counted by :mod:`tidelog.telemetry`,
  below every layer.
- :mod:`tidelog.ui.health`: ``/healthz`` (alive) and ``/readyz`` (registered, metadata in sync, NATS and etcd
  reachable), with a JSON body saying what is not ready.

This package reads the broker and never changes it. It sits beside :mod:`tidelog.api` in the layers.
"""
