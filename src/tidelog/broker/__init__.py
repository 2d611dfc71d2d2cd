"""The broker's runtime: partition manager, NATS ingest, transactional appends, configuration, the embedded NATS
and etcd servers of ``tidelog serve`` and the one translation of lower layers' exceptions into domain errors
(:mod:`~tidelog.broker.translate`). The process that composes it with the API above it is :mod:`tidelog.server`.

A partition this broker leads is :mod:`~tidelog.broker.partition`; each write to it runs through the state
machine of :mod:`~tidelog.broker.write_path` (admit, dedupe, place, durable, committed, answer), which returns
routable refusals as status values for the protocol edges to answer.
"""
