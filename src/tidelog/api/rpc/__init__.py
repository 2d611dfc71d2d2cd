"""The Liftbridge-compatible gRPC service ``proto.API``: one module per RPC family, a thin servicer on top."""
