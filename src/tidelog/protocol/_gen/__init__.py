"""Generated protobuf and gRPC modules of the ``.proto`` files under ``tidelog/protocol/proto/`` (``api_pb2``: the
Liftbridge ``proto.API``; ``tidelog.v1``: tidelog's own services). Do not edit: regenerate with
``python -m tidelog.protocol.gen_proto`` (``--check`` reports whether these files are stale)."""
