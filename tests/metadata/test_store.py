"""MetadataStore against a real etcd: broker registration survives a lapsed lease."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aetcd
import pytest
import pytest_asyncio

from tidelog.broker.config_values import parse_etcd_endpoint
from tidelog.broker.embedded import EmbeddedEtcd
from tidelog.metadata.mirror import MetadataMirror
from tidelog.metadata.records import BrokerRecord, Keys
from tidelog.metadata.store import MetadataStore

pytestmark = pytest.mark.slow


@pytest_asyncio.fixture
async def client(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[aetcd.Client]:
    async with EmbeddedEtcd(tmp_path_factory.mktemp("etcd")) as etcd:
        host, port = parse_etcd_endpoint(etcd.endpoints[0])
        c = aetcd.Client(host=host, port=port, timeout=10)
        await c.connect()
        try:
            yield c
        finally:
            await c.close()


async def test_registration_comes_back_after_the_lease_lapses(client: aetcd.Client) -> None:
    keys = Keys("/lapse")
    store = MetadataStore(client, keys)
    mirror = MetadataMirror(client, keys)
    await mirror.start()
    try:
        await store.register_broker(BrokerRecord("b1", "127.0.0.1", 1, 2, 3), ttl_seconds=1)
        await mirror.wait_for(lambda s: "b1" in s.brokers, 10)
        # What a pause past the TTL does: etcd forgets the lease and the registration goes with it.
        await client.revoke_lease(store._lease.id)
        await mirror.wait_for(lambda s: "b1" not in s.brokers, 10)
        await mirror.wait_for(lambda s: "b1" in s.brokers, 10)  # the keep-alive registered the broker again
    finally:
        await store.deregister_broker()
        await mirror.stop()
