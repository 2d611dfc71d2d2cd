"""``tidelog dev-cluster --tls``: one command runs a cluster with TLS everywhere and says how to connect; the CLI
connects with what it printed (``TIDELOG_CLIENT_TLS_*``), and without TLS it is refused in one line."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tidelog.local.serve_process import TIDELOG, clean_env

pytestmark = pytest.mark.slow

TIMEOUT = 60.0


async def tidelog(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(TIDELOG), *args], capture_output=True, text=True, timeout=TIMEOUT, env=clean_env(COLUMNS="200", **env)
        )

    return await asyncio.to_thread(run)


async def test_dev_cluster_with_tls_prints_how_to_connect_and_the_cli_connects(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        str(TIDELOG), "dev-cluster", "--tls", "--brokers", "2", "--data-dir", str(tmp_path / "dev"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=clean_env(COLUMNS="400"),
        start_new_session=True,
    )  # fmt: skip
    assert process.stdout is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(TIMEOUT):
            while not lines or "Ctrl-C to stop" not in lines[-1]:
                line = await process.stdout.readline()
                assert line, "dev-cluster exited early:\n" + "".join(lines)
                lines.append(line.decode())
        out = "".join(lines)
        brokers = re.search(r"TIDELOG_BROKERS=(\S+)", out)
        tls = dict(re.findall(r"(TIDELOG_CLIENT_TLS_(?:CA|CERT|KEY))=(\S+)", out))
        assert brokers is not None and set(tls) == {
            "TIDELOG_CLIENT_TLS_CA",
            "TIDELOG_CLIENT_TLS_CERT",
            "TIDELOG_CLIENT_TLS_KEY",
        }, out
        env = {"TIDELOG_BROKERS": brokers.group(1), **tls}

        created = await tidelog("stream", "create", "secure", "--replication-factor", "2", **env)
        assert created.returncode == 0, created.stderr
        listed = await tidelog("stream", "list", **env)
        assert listed.returncode == 0 and "secure" in listed.stdout, listed.stderr
        # The same with flags instead of the environment.
        flags = ["--tls-ca", tls["TIDELOG_CLIENT_TLS_CA"], "--tls-cert", tls["TIDELOG_CLIENT_TLS_CERT"]]
        flags += ["--tls-key", tls["TIDELOG_CLIENT_TLS_KEY"]]
        listed = await tidelog("stream", "list", "--brokers", brokers.group(1), *flags)
        assert listed.returncode == 0 and "secure" in listed.stdout, listed.stderr

        etcd = re.search(r"etcd: (\S+)", out)
        assert etcd is not None
        status = await tidelog("cluster", "status", "--etcd-endpoints", etcd.group(1), "-o", "json", *flags)
        assert status.returncode == 0, status.stderr
        secure = [p for p in json.loads(status.stdout)["partitions"] if p["stream"] == "secure"]
        assert secure and secure[0]["high_watermark"] == 0  # the leader answered over TLS

        plaintext = await tidelog("stream", "list", TIDELOG_BROKERS=brokers.group(1))
        assert plaintext.returncode == 1
        assert "is it a TLS port" in plaintext.stderr and "Traceback" not in plaintext.stderr
        no_certificate = await tidelog(
            "stream", "list", TIDELOG_BROKERS=brokers.group(1), TIDELOG_CLIENT_TLS_CA=tls["TIDELOG_CLIENT_TLS_CA"]
        )
        assert no_certificate.returncode == 1
        assert "refused ours" in no_certificate.stderr and "Traceback" not in no_certificate.stderr

        # ACLs are on: the printed super user (admin) did all of the above; the principal 'client' may do
        # nothing until an ACL allows it, and then exactly that.
        assert "ACLs on" in out and "super user 'admin'" in out, out
        user = re.search(r"The principal 'client' \((\S+), key (\S+)\)", out)
        assert user is not None, out
        as_client = {**env, "TIDELOG_CLIENT_TLS_CERT": user.group(1), "TIDELOG_CLIENT_TLS_KEY": user.group(2)}
        denied = await tidelog("stream", "list", **as_client)
        assert denied.returncode == 1 and "Traceback" not in denied.stderr, denied.stderr
        assert "principal client may not describe cluster" in denied.stderr, denied.stderr
        added = await tidelog(
            "acl", "add", "--allow-principal", "client", "--operation", "describe", "--cluster",
            "--etcd-endpoints", etcd.group(1),
        )  # fmt: skip
        assert added.returncode == 0 and "added: allow client describe on cluster" in added.stdout, added.stderr
        for _ in range(100):  # bounded: until every broker's mirror has the entry (etcd's watch, well under 1 s)
            listed = await tidelog("stream", "list", **as_client)
            if listed.returncode == 0:
                break
            await asyncio.sleep(0.1)
        assert listed.returncode == 0 and "secure" in listed.stdout, listed.stderr
        refused = await tidelog("stream", "delete", "secure", "--yes", **as_client)
        assert refused.returncode == 1 and "may not delete stream 'secure'" in refused.stderr, refused.stderr
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(TIMEOUT):
            rest = await process.stdout.read()
            code = await process.wait()
    assert code == 0, "".join(lines) + rest.decode()
