"""Generated protobuf and gRPC modules of ``tidelog/api/proto/*.proto``. Do not edit: regenerate with
``python -m tidelog.api.gen_proto`` (``--check`` reports whether these files are stale)."""
