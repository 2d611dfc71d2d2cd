"""The gRPC services: the Liftbridge-compatible ``proto.API``, and tidelog's own ``tidelog.v1.Appender``
(transactional appends) and ``tidelog.v1.Admin`` (reshaping the cluster). One module per RPC family, a thin
servicer on top (:mod:`~tidelog.api.rpc.service`)."""
