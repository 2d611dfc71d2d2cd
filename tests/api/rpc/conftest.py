"""The Liftbridge API tests run against a real broker: the fixtures are the broker tests' own."""

from tests.broker.conftest import broker, broker_settings, nc, stream_name, stub

__all__ = ["broker", "broker_settings", "nc", "stream_name", "stub"]
