"""Hosts on one machine, each in a network namespace of its own, on one bridge: real network partitions.

A broker, etcd or NATS run in a :class:`NetLab` host has an address of its own (``10.X.Y.k``), so a rule can cut
the traffic between two of them while both keep running and every other path stays open: a true partition,
which a TCP proxy in front of one port cannot make (it cuts a broker from everyone, or from no one). The process
that owns the lab (a test, :mod:`tidelog.testing.faults`) stays in the machine's own namespace and reaches every
host through the bridge, as a client on another machine would.

Layout, for a lab tagged ``T`` on subnet ``10.X.Y.0/24``::

    root namespace ── bridge tlbT (10.X.Y.1) ──┬── veth ── namespace tlT-a (10.X.Y.2)
                                               └── veth ── namespace tlT-b (10.X.Y.3) …

A process runs in a host through ``ip netns exec`` (:meth:`NetLab.command`), which enters the namespace and
then executes the program itself: the PID a caller gets is the program's, so it is stopped by PID as usual.

Partitions are blackhole routes (``ip route add blackhole ADDRESS/32`` inside a namespace): a host with one
drops every packet it would send to that address. :meth:`NetLab.cut` makes ``a`` unable to send to ``b``; for
TCP that is a partition both ways (``b``'s SYN reaches ``a``, whose SYN-ACK is dropped; an established
connection's segments and acknowledgements stop one way, so it stalls both ways). :meth:`NetLab.partition`
cuts two groups from each other both ways, :meth:`NetLab.isolate` one host from every other host and the
root namespace, :meth:`NetLab.heal` removes every cut. Needs root (or ``CAP_NET_ADMIN``) and iproute2's ``ip``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

__all__ = ["Host", "NetLab", "NetLabError", "netlab_available"]

_IFNAME_MAX = 15  # Linux interface names (IFNAMSIZ - 1)
_SUBNET_ATTEMPTS = 32


class NetLabError(RuntimeError):
    """An ``ip`` command failed, or the machine cannot host a lab (names the command and what it printed)."""


@dataclass(frozen=True, slots=True)
class Host:
    """One host of a lab: its name, namespace and address."""

    name: str
    namespace: str
    address: str
    veth: str  # the root namespace's end of the host's link

    def command(self, argv: Sequence[str | os.PathLike[str]]) -> list[str]:
        """``argv`` run inside this host's namespace (the program keeps the PID ``ip netns exec`` started with)."""
        return ["ip", "netns", "exec", self.namespace, *(str(each) for each in argv)]


def netlab_available() -> str | None:
    """None when this machine can run a lab here; otherwise why not (for a test's skip reason or an error)."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (make system-deps installs it)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    return None


def _free_subnet() -> ipaddress.IPv4Network:
    """A random 10.200-254.x.0/24 that no interface of this machine is on (read once, when a lab is made)."""
    shown = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=False).stdout
    used = [ipaddress.ip_interface(line.split()[3]).network for line in shown.splitlines() if len(line.split()) > 3]
    for _ in range(_SUBNET_ATTEMPTS):
        candidate = ipaddress.IPv4Network(f"10.{secrets.randbelow(55) + 200}.{secrets.randbelow(256)}.0/24")
        if not any(candidate.overlaps(network) for network in used):
            return candidate
    raise NetLabError(f"no free 10.200-254.x.0/24 subnet after {_SUBNET_ATTEMPTS} tries")


async def _ip(*args: str, check: bool = True) -> str:
    """Run ``ip ARGS``; its stdout. :class:`NetLabError` with its stderr when it fails and ``check``."""
    process = await asyncio.create_subprocess_exec(
        "ip", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    stdout, stderr = await process.communicate()
    if check and process.returncode != 0:
        raise NetLabError(f"ip {' '.join(args)} failed ({process.returncode}): {stderr.decode().strip()}")
    return stdout.decode()


class NetLab:
    """A bridge and the hosts on it. ``async with NetLab(["a", "b"]) as lab:`` builds it and always tears it down.

    The hosts and their addresses are known from construction (so a cluster can be configured with them before
    anything exists); :meth:`start` creates them."""

    def __init__(self, names: Sequence[str], tag: str | None = None) -> None:
        self.tag = tag or secrets.token_hex(2)
        if not self.tag.isalnum() or len(f"tlb{self.tag}") > _IFNAME_MAX - 3:
            raise ValueError(f"lab tag {self.tag!r}: letters and digits, at most {_IFNAME_MAX - 6} of them")
        if len(set(names)) != len(names):
            raise ValueError(f"host names must differ: {', '.join(names)}")
        if len(names) > 253:
            raise ValueError(f"a lab holds at most 253 hosts, not {len(names)}")
        for name in names:
            if not name or not name.replace("-", "").isalnum():
                raise ValueError(f"host name {name!r}: letters, digits and '-' only")
        self.bridge = f"tlb{self.tag}"
        self.subnet = _free_subnet()
        self.gateway = str(self.subnet[1])
        """The root namespace's address on the bridge: where every connection from the lab's owner comes from."""
        self.hosts = {
            name: Host(name, f"tl{self.tag}-{name}", str(self.subnet[index]), f"tlv{self.tag}{index}")
            for index, name in enumerate(names, start=2)  # .1 is the gateway
        }
        self._cuts: set[tuple[str, str]] = set()  # (host name, address it cannot send to)

    # ---- lifecycle ----

    async def start(self) -> None:
        """Create the bridge, then each host: a namespace with loopback up, linked to the bridge."""
        reason = netlab_available()
        if reason is not None:
            raise NetLabError(f"cannot build a network lab: {reason}")
        try:
            await _ip("link", "add", self.bridge, "type", "bridge")
            await _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            await _ip("link", "set", self.bridge, "up")
            for host in self.hosts.values():
                await self._create(host)
        except BaseException:
            await self.stop()
            raise

    async def _create(self, host: Host) -> None:
        peer = "tlp" + host.veth[3:]
        await _ip("netns", "add", host.namespace)
        await _ip("link", "add", host.veth, "type", "veth", "peer", "name", peer)
        await _ip("link", "set", peer, "netns", host.namespace)
        await _ip("link", "set", host.veth, "master", self.bridge)
        await _ip("link", "set", host.veth, "up")
        await _ip("-n", host.namespace, "link", "set", "lo", "up")
        await _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", peer)
        await _ip("-n", host.namespace, "link", "set", peer, "up")

    async def stop(self) -> None:
        """Delete every namespace (their processes must be stopped first), link and the bridge; idempotent."""
        for host in self.hosts.values():
            await _ip("netns", "del", host.namespace, check=False)  # takes the host's end of the veth with it
            await _ip("link", "del", host.veth, check=False)
        self._cuts.clear()
        await _ip("link", "del", self.bridge, check=False)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # ---- processes ----

    def command(self, host: str, argv: Sequence[str | os.PathLike[str]]) -> list[str]:
        """``argv`` run inside ``host``'s namespace."""
        return self.host(host).command(argv)

    def host(self, name: str) -> Host:
        try:
            return self.hosts[name]
        except KeyError:
            raise KeyError(f"no host {name!r} in this lab (hosts: {', '.join(self.hosts) or 'none'})") from None

    # ---- faults ----

    async def cut(self, source: str, target: str) -> None:
        """``source`` can no longer send to ``target`` (a host name, or ``"gateway"``: the lab's owner)."""
        address = self.gateway if target == "gateway" else self.host(target).address
        if (source, address) in self._cuts:
            return
        await _ip("-n", self.host(source).namespace, "route", "add", "blackhole", f"{address}/32")
        self._cuts.add((source, address))

    async def partition(self, side: Iterable[str], other: Iterable[str]) -> None:
        """Every host of ``side`` and every host of ``other`` stop reaching each other, both ways."""
        first, second = list(side), list(other)
        for a in first:
            for b in second:
                await self.cut(a, b)
                await self.cut(b, a)

    async def isolate(self, name: str) -> None:
        """``name`` reaches no other host and no one reaches it, the lab's owner included."""
        await self.partition([name], [other for other in self.hosts if other != name])
        await self.cut(name, "gateway")

    async def heal(self) -> None:
        """Remove every cut."""
        for source, address in sorted(self._cuts):
            await _ip("-n", self.host(source).namespace, "route", "del", "blackhole", f"{address}/32", check=False)
        self._cuts.clear()

    @property
    def cuts(self) -> list[tuple[str, str]]:
        """The cuts in place, as (host, address it cannot send to), sorted."""
        return sorted(self._cuts)
