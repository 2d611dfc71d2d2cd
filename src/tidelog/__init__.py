"""tidelog: a durable, replicated, horizontally scalable log for NATS.

Packages: ``storage`` (the partition commit log), ``metadata`` (etcd mirror and controller), ``replication``,
``broker`` (the server process), ``api`` (gRPC and the tidelog wire protocol), ``client``, ``cli``, ``spark``
and ``testing`` (harnesses other tests import).
"""

__version__ = "0.1.0"
