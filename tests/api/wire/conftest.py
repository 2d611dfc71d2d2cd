"""Wire protocol tests that need a real broker use the broker tests' own fixtures."""

from tests.broker.conftest import broker, broker_settings, nc, stream_name, stub

__all__ = ["broker", "broker_settings", "nc", "stream_name", "stub"]
