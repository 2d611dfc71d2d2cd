"""Brokers on this machine, for development and for tests: ``tidelog dev-cluster``'s local cluster.

:mod:`~tidelog.local.cluster` runs one nats-server, one etcd and N ``tidelog serve`` children on free loopback
ports (``LocalCluster``), with each broker's wire port optionally behind a :class:`~tidelog.local.tcp_proxy.TcpProxy`
that can cut its connections; :mod:`~tidelog.local.serve_process` runs one ``tidelog serve`` child and knows when
it serves; :mod:`~tidelog.local.certificates` makes a throwaway CA and certificates for a cluster with TLS
(``dev-cluster --tls``). Production code: the ``dev-cluster`` command runs it, and the test harness
(:mod:`tidelog.testing`) builds its fault scenarios on it.
"""
