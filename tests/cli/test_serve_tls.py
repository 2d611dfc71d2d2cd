"""``tidelog serve`` refuses TLS settings it cannot honour in one line, before starting anything."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import trustme

from tidelog.local.serve_process import TIDELOG, clean_env

TIMEOUT = 60.0


def serve(tmp_path: Path, *settings: str) -> subprocess.CompletedProcess[str]:
    argv = [str(TIDELOG), "serve", "--data-dir", str(tmp_path / "data"), "--port", "0", "--wire-port", "0"]
    for setting in settings:
        argv += ["-s", setting]
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, env=clean_env())


@pytest.mark.parametrize("problem", ["missing", "mismatched key", "half a pair"])
def test_unusable_tls_settings_refuse_to_start(tmp_path: Path, problem: str) -> None:
    ca = trustme.CA()
    cert, key = tmp_path / "c.pem", tmp_path / "c.key"
    cert.write_bytes(ca.issue_cert("127.0.0.1").cert_chain_pems[0].bytes())
    key.write_bytes(ca.issue_cert("127.0.0.1").private_key_pem.bytes())  # another certificate's key
    settings, expected = {
        "missing": ((f"tls_cert={tmp_path / 'nope.pem'}", f"tls_key={key}"), "does not exist"),
        "mismatched key": ((f"tls_cert={cert}", f"tls_key={key}"), "the key does not belong to the certificate"),
        "half a pair": ((f"tls_cert={cert}",), "set together with tls_cert"),
    }[problem]
    result = serve(tmp_path, *settings)
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr
