"""``python -m tidelog.protocol.gen_proto``: where generated modules land, and that ``--check`` sees every file."""

from __future__ import annotations

import shutil
from pathlib import Path

from tidelog.protocol import gen_proto


def test_modules_land_under_the_protos_own_directory(tmp_path: Path) -> None:
    written = {path.relative_to(tmp_path).as_posix() for path in gen_proto.generate(tmp_path)}
    assert {
        "api_pb2.py",
        "api_pb2_grpc.py",
        "tidelog/__init__.py",
        "tidelog/v1/__init__.py",
        "tidelog/v1/append_pb2.py",
        "tidelog/v1/append_pb2.pyi",
        "tidelog/v1/append_pb2_grpc.py",
    } <= written
    grpc_module = (tmp_path / "tidelog" / "v1" / "append_pb2_grpc.py").read_text(encoding="utf-8")
    assert "from . import append_pb2 as tidelog_dot_v1_dot_append__pb2\n" in grpc_module
    assert "from tidelog.v1 import" not in grpc_module  # would import the broker's own package, not this one
    assert "from . import api_pb2 as api__pb2\n" in (tmp_path / "api_pb2_grpc.py").read_text(encoding="utf-8")


def test_check_reports_a_missing_or_changed_file_in_a_subpackage(tmp_path: Path) -> None:
    copy = tmp_path / "_gen"
    shutil.copytree(gen_proto.GEN_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert gen_proto.stale_files(copy) == []
    (copy / "tidelog" / "v1" / "__init__.py").unlink()
    (copy / "tidelog" / "v1" / "append_pb2.pyi").write_text("# edited by hand\n", encoding="utf-8")
    assert gen_proto.stale_files(copy) == ["tidelog/v1/__init__.py", "tidelog/v1/append_pb2.pyi"]
