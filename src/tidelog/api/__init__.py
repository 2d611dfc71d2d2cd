"""Protocols: the Liftbridge-compatible gRPC ``proto.API`` service, ``tidelog.v1`` admin RPCs, the tidelog wire
protocol (length-prefixed frames over TCP), and the one table mapping domain errors to wire statuses."""
