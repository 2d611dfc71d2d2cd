"""The broker process: composition root, partition manager, NATS ingest, configuration and the embedded
NATS and etcd servers of ``tidelog serve``.

A partition this broker leads is :mod:`~tidelog.broker.partition`; each write to it runs through the state
machine of :mod:`~tidelog.broker.write_path` (admit, dedupe, place, durable, committed, answer), which returns
routable refusals as status values for the protocol edges to answer.
"""
