"""The broker's runtime: partition manager, NATS ingest, transactional appends, configuration, the embedded NATS
and etcd servers of ``tidelog serve`` and the one translation of lower layers' exceptions into domain errors
(:mod:`~tidelog.broker.translate`). The process that composes it with the API above it is :mod:`tidelog.server`."""
