"""The ``tls.*`` options of the Spark source and sink: files checked on the driver, carried as paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.protocol.tls import TlsFiles
from tidelog.spark.options import SourceOptionError, parse_options
from tidelog.spark.sink_options import SinkOptionError, parse_sink_options


def test_tls_options_become_files(tmp_path: Path) -> None:
    for name in ("ca.pem", "c.pem", "c.key"):
        (tmp_path / name).write_text("x")
    given = {
        "tls.ca": str(tmp_path / "ca.pem"),
        "TLS.CERT": str(tmp_path / "c.pem"),
        "tls.key": str(tmp_path / "c.key"),
    }
    expected = TlsFiles(ca=tmp_path / "ca.pem", cert=tmp_path / "c.pem", key=tmp_path / "c.key")
    assert parse_options({"streams": "s", **given}).tls == expected
    assert parse_sink_options({"stream": "s", **given}).tls == expected
    assert parse_options({"streams": "s"}).tls is None and parse_options({"streams": "s"}).ssl() is None


def test_missing_files_and_half_pairs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SourceOptionError, match=r"'tls.ca'.*is not a file"):
        parse_options({"streams": "s", "tls.ca": str(tmp_path / "nope.pem")})
    (tmp_path / "c.pem").write_text("x")
    with pytest.raises(SinkOptionError, match=r"'tls.key'.*go together"):
        parse_sink_options({"stream": "s", "tls.cert": str(tmp_path / "c.pem")})
