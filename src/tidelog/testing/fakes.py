"""Stand-ins for a broker's collaborators, for tests that run one real part against fakes of the rest.

- :class:`StubManager`: a partition manager that leads exactly the partitions it is given (wire-server tests);
- :class:`FakeNats`: a NATS client that records the subscription callback, so the test delivers messages when it
  chooses (:class:`Delivered`), and records what is published (NATS ingest tests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tidelog.broker.partitions.partition import Partition
from tidelog.protocol.errors import UnknownStreamError


@dataclass
class StubManager:
    """Leads exactly the partitions it holds; anything else is an unknown stream."""

    partitions: dict[tuple[str, int], Partition] = field(default_factory=dict)

    def leader_of(self, stream: str, partition: int) -> Partition:
        found = self.partitions.get((stream, partition))
        if found is None:
            raise UnknownStreamError(f"no stream named {stream!r}")
        return found


@dataclass
class Delivered:
    """A message as nats-py's callback receives it (the fields NATS ingest reads)."""

    subject: str
    reply: str
    data: bytes
    headers: dict[str, str] | None = None


class FakeSubscription:
    async def unsubscribe(self) -> None:
        pass


@dataclass
class FakeNats:
    """Records the subscription callback, so the test delivers messages when it chooses."""

    callback: Callable[[Any], Any] | None = None
    published: list[tuple[str, bytes]] = field(default_factory=list)

    async def subscribe(self, subject: str, *, cb: Callable[[Any], Any], **_: Any) -> FakeSubscription:
        self.callback = cb
        return FakeSubscription()

    async def publish(self, subject: str, data: bytes) -> None:
        self.published.append((subject, data))

    async def flush(self) -> None:
        pass

    async def deliver(self, message: Delivered) -> None:
        assert self.callback is not None
        await self.callback(message)
