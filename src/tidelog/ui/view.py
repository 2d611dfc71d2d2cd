"""What the HTTP side reads of a broker: one object handed over by the composition root.

The UI never starts or changes anything: it reads the partition manager (led and followed replicas, their
offsets, ISRs and follower progress, the NATS ingests), the metadata mirror (brokers, partitions, whether it
follows etcd), the controller election, the consumer groups and cursors, and asks NATS and etcd whether they
answer. :class:`BrokerView` bundles those references, so the collectors, the health checks and later pages take
one argument and tests can build one from a running :class:`~tidelog.server.Broker`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidelog.broker.config import BrokerConfig
from tidelog.broker.cursors import CursorStore
from tidelog.broker.manager import PartitionManager
from tidelog.broker.tiering import Tiering
from tidelog.metadata.controller_election import ControllerElection
from tidelog.metadata.group_mirror import GroupMirror
from tidelog.metadata.mirror import MetadataMirror


@dataclass(frozen=True, slots=True)
class BrokerView:
    """References to one broker's running parts (owned by the broker; the UI only reads them)."""

    broker_id: str
    config: BrokerConfig
    manager: PartitionManager
    mirror: MetadataMirror
    election: ControllerElection
    nats: Any  # the broker's BrokerNats: ``is_connected``
    etcd: Any  # the broker's etcd client: ``status()``
    cursors: CursorStore | None = None
    groups: GroupMirror | None = None
    registered: Callable[[], bool] = lambda: True  # the broker wrote its registration in etcd (this run)
    tiering: Tiering | None = None  # the offload task, on a broker with a tiered store
