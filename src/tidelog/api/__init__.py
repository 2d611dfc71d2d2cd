"""The broker's protocol edge: the Liftbridge-compatible gRPC ``proto.API`` service and the ``tidelog.v1`` RPCs
(:mod:`~tidelog.api.rpc`), and the tidelog wire protocol's server, sessions and handlers
(:mod:`~tidelog.api.wire`); the listeners' TLS certificates, reloaded when their files change
(:mod:`~tidelog.api.server_tls`), and the verified client certificate of a connection, the seam for principals
(:mod:`~tidelog.api.peer_certificate`). Frames, message schemas, generated protobuf modules and the error table are
:mod:`tidelog.protocol`'s; a lower layer's exception becomes a domain error in :mod:`tidelog.broker.translate`."""
