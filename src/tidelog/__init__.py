"""tidelog: a durable, replicated, horizontally scalable log for NATS.

Layers, top to bottom (each imports only those below it; ``lint-imports`` checks the contracts in
``pyproject.toml``): ``cli`` → ``spark`` → ``client`` and ``server`` (the broker process, composition root) →
``api`` (gRPC and the wire protocol's server) → ``broker`` (the partition runtime) → ``replication`` and
``metadata`` (etcd mirror and controller) → ``storage`` (the partition commit log) → ``protocol`` (errors, frames,
messages, the wire connection, label sets), beside the small shared ``clock``, ``deadline`` and ``launch``
(child processes). ``testing`` (the multi-process harness and fault tools) is imported only by tests,
benchmarks and the fault tools; the harnesses other tests import live there too.
"""

__version__ = "0.1.0"
