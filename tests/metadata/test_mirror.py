"""MetadataMirror against a real etcd whose connection breaks: the mirror watches again and misses nothing (its
watch task used to end with the broken watch, and the broker's metadata then stayed frozen for good)."""

from __future__ import annotations

import aetcd
import pytest

from tests.helpers import BOUND
from tidelog.broker.config_values import parse_etcd_endpoint
from tidelog.broker.embedded import EmbeddedEtcd
from tidelog.local.tcp_proxy import TcpProxy
from tidelog.metadata.mirror import MetadataMirror
from tidelog.metadata.records import BrokerRecord, Keys, encode

pytestmark = pytest.mark.slow


async def test_the_mirror_follows_etcd_through_a_broken_connection(tmp_path_factory: pytest.TempPathFactory) -> None:
    keys = Keys("/rewatch")
    async with EmbeddedEtcd(tmp_path_factory.mktemp("etcd")) as etcd:
        host, port = parse_etcd_endpoint(etcd.endpoints[0])
        direct = aetcd.Client(host=host, port=port, timeout=10)
        await direct.connect()
        async with TcpProxy(host, port) as proxy:
            through_proxy = aetcd.Client(host="127.0.0.1", port=proxy.port, timeout=10)
            await through_proxy.connect()
            mirror = MetadataMirror(through_proxy, keys)
            await mirror.start()
            try:
                await direct.put(keys.broker("b1"), encode(BrokerRecord("b1", "127.0.0.1", 1, 2, 3)))
                await mirror.wait_for(lambda s: "b1" in s.brokers, BOUND)

                proxy.cut(refuse=True)  # the mirror's watch breaks; changes go on without it
                await direct.put(keys.broker("b2"), encode(BrokerRecord("b2", "127.0.0.1", 4, 5, 6)))
                await direct.delete(keys.broker("b1"))
                proxy.heal()

                await mirror.wait_for(lambda s: "b2" in s.brokers and "b1" not in s.brokers, BOUND)
                await direct.put(keys.broker("b3"), encode(BrokerRecord("b3", "127.0.0.1", 7, 8, 9)))
                await mirror.wait_for(lambda s: "b3" in s.brokers, BOUND)
            finally:
                await mirror.stop()
                await through_proxy.close()
        await direct.close()
