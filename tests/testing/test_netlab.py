"""NetLab: hosts in network namespaces reach each other until a cut, a partition or an isolation, and again after
a heal; nothing of the lab is left on the machine afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator

import pytest

from tidelog.testing.netlab import NetLab, netlab_available

PORT = 7000
ECHO_SERVER = f"""
import socket
server = socket.create_server((__import__("sys").argv[1], {PORT}))
while True:
    connection, _ = server.accept()
    with connection:
        connection.sendall(connection.recv(64))
"""
PROBE = f"""
import socket, sys
try:
    with socket.create_connection((sys.argv[1], {PORT}), timeout=0.5) as s:
        s.sendall(b"ping")
        sys.exit(0 if s.recv(64) == b"ping" else 2)
except OSError:
    sys.exit(1)
"""


@pytest.fixture
async def lab() -> AsyncIterator[NetLab]:
    assert netlab_available() is None, netlab_available()
    async with NetLab(["a", "b", "c"]) as built:
        yield built


@contextlib.asynccontextmanager
async def echo_server(lab: NetLab, host: str) -> AsyncIterator[None]:
    argv = lab.command(host, [sys.executable, "-c", ECHO_SERVER, lab.host(host).address])
    process = await asyncio.create_subprocess_exec(*argv)
    try:
        for _ in range(100):  # bounded: 100 × 50 ms
            if await reach_from_owner(lab, host):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"the echo server in {host} never answered")
        yield
    finally:
        process.kill()  # by PID: `ip netns exec` executed the interpreter in its own place
        await process.wait()


async def reach_from_owner(lab: NetLab, host: str) -> bool:
    """Whether the lab's owner (this process, in the root namespace) gets an echo from ``host``."""
    try:
        async with asyncio.timeout(0.5):
            reader, writer = await asyncio.open_connection(lab.host(host).address, PORT)
            writer.write(b"ping")
            answer = await reader.read(64)
            writer.close()
            return answer == b"ping"
    except (OSError, TimeoutError):
        return False


async def reach(lab: NetLab, source: str, target: str) -> bool:
    """Whether a process in ``source`` gets an echo from ``target``."""
    argv = lab.command(source, [sys.executable, "-c", PROBE, lab.host(target).address])
    process = await asyncio.create_subprocess_exec(*argv)
    return await asyncio.wait_for(process.wait(), 10) == 0


async def output(*argv: str) -> str:
    process = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
    stdout, _ = await process.communicate()
    assert process.returncode == 0, argv
    return stdout.decode()


async def test_hosts_reach_each_other_and_the_owner(lab: NetLab) -> None:
    async with echo_server(lab, "b"):
        assert await reach(lab, "a", "b")
        assert await reach(lab, "c", "b")
        assert await reach_from_owner(lab, "b")


async def test_a_partition_cuts_only_the_paths_between_its_sides(lab: NetLab) -> None:
    async with echo_server(lab, "b"):
        await lab.partition(["a"], ["b"])
        assert not await reach(lab, "a", "b")
        assert await reach(lab, "c", "b"), "a partition of a from b must leave c's path open"
        assert await reach_from_owner(lab, "b")
        await lab.heal()
        assert lab.cuts == []
        assert await reach(lab, "a", "b")


async def test_one_cut_breaks_tcp_both_ways(lab: NetLab) -> None:
    """b cannot send to a: a's connections to b get no SYN-ACK back."""
    async with echo_server(lab, "b"):
        await lab.cut("b", "a")
        assert not await reach(lab, "a", "b")
        assert await reach(lab, "c", "b")


async def test_an_isolated_host_is_out_of_reach_of_the_owner_too(lab: NetLab) -> None:
    async with echo_server(lab, "b"):
        await lab.isolate("b")
        assert not await reach_from_owner(lab, "b")
        assert not await reach(lab, "a", "b")
        await lab.heal()
        assert await reach_from_owner(lab, "b")


async def test_nothing_is_left_behind() -> None:
    async with NetLab(["only"]) as lab:
        host = lab.host("only")
        await lab.cut("only", "gateway")
    namespaces = await output("ip", "netns", "list")
    links = await output("ip", "-o", "link", "show")
    assert host.namespace not in namespaces
    assert lab.bridge not in links and host.veth not in links


async def test_bad_names_are_refused(lab: NetLab) -> None:
    with pytest.raises(ValueError, match="must differ: a, a"):
        NetLab(["a", "a"])
    with pytest.raises(ValueError, match="letters, digits"):
        NetLab(["no spaces"])
    with pytest.raises(KeyError, match="no host 'z'"):
        await lab.cut("a", "z")
    with pytest.raises(ValueError, match="lab tag"):
        NetLab(["a"], tag="much-too-long-a-tag")


async def test_addresses_are_known_before_the_lab_exists() -> None:
    lab = NetLab(["a", "b"])
    assert lab.host("a").address != lab.host("b").address
    assert lab.host("a").address in [str(address) for address in lab.subnet.hosts()]
