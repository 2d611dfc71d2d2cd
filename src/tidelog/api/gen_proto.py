"""Regenerate the Python modules of ``proto/api.proto`` into ``_gen/``: ``python -m tidelog.api.gen_proto``.

The generated files are checked in, so a fresh clone imports them without running protoc; this module is the one
command that rebuilds them, and ``--check`` tells CI whether the checked-in files still match the ``.proto``.

protoc writes the gRPC module with a top-level ``import api_pb2``, which only works when ``_gen/`` itself is on
``sys.path``. The broker imports it as ``tidelog.api._gen``, so the import is rewritten to a relative one after
each generation; the rewrite fails loudly if a future grpcio-tools stops emitting the expected line.

Usage::

    python -m tidelog.api.gen_proto           # regenerate and patch
    python -m tidelog.api.gen_proto --check   # exit 1 if the checked-in files are stale
"""

from __future__ import annotations

import argparse
import importlib.resources
import sys
import tempfile
from pathlib import Path

API_DIR = Path(__file__).resolve().parent
PROTO_DIR = API_DIR / "proto"
GEN_DIR = API_DIR / "_gen"
PROTO_FILES = ("api.proto",)

_GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


class ProtoGenerationError(RuntimeError):
    """protoc failed, or its output was not what the patch step expects."""


def _protoc(out_dir: Path) -> None:
    """Run protoc in-process (grpc_tools bundles it), so no system protoc of another version is ever picked up."""
    from grpc_tools import protoc  # imported here: only regeneration needs grpcio-tools loaded

    well_known = importlib.resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_DIR}",
        f"--proto_path={well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *PROTO_FILES,
    ]
    status = protoc.main(args)
    if status != 0:
        raise ProtoGenerationError(f"protoc exited with status {status} for {', '.join(PROTO_FILES)}")


def _patch_grpc_imports(out_dir: Path) -> None:
    """Turn ``import api_pb2 as api__pb2`` into ``from . import api_pb2 as api__pb2`` in every gRPC module."""
    for proto in PROTO_FILES:
        module = proto.removesuffix(".proto").replace("-", "_")
        grpc_file = out_dir / f"{module}_pb2_grpc.py"
        text = grpc_file.read_text(encoding="utf-8")
        alias = module.replace("_", "__") + "__pb2"
        old = f"import {module}_pb2 as {alias}\n"
        new = f"from . import {module}_pb2 as {alias}\n"
        if old not in text:
            raise ProtoGenerationError(
                f"{grpc_file.name}: expected the line {old.strip()!r} to rewrite; protoc changed?"
            )
        grpc_file.write_text(text.replace(old, new), encoding="utf-8")


def _generated_files(directory: Path) -> dict[str, bytes]:
    return {
        path.name: path.read_bytes()
        for path in sorted(directory.iterdir())
        if path.is_file() and path.name.endswith(_GENERATED_SUFFIXES)
    }


def generate(out_dir: Path = GEN_DIR) -> list[Path]:
    """Regenerate and patch the modules into ``out_dir``; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _protoc(out_dir)
    _patch_grpc_imports(out_dir)
    return [out_dir / name for name in _generated_files(out_dir)]


def stale_files(gen_dir: Path = GEN_DIR) -> list[str]:
    """Names of generated files in ``gen_dir`` that differ from a fresh generation (missing or extra included)."""
    with tempfile.TemporaryDirectory(prefix="tidelog-proto-") as scratch:
        generate(Path(scratch))
        fresh = _generated_files(Path(scratch))
    current = _generated_files(gen_dir) if gen_dir.is_dir() else {}
    return sorted(name for name in fresh.keys() | current.keys() if fresh.get(name) != current.get(name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tidelog.api.gen_proto", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether the checked-in files are stale")
    options = parser.parse_args(argv)
    if options.check:
        stale = stale_files()
        if stale:
            print(f"stale generated files in {GEN_DIR}: {', '.join(stale)}", file=sys.stderr)
            print("regenerate with: python -m tidelog.api.gen_proto", file=sys.stderr)
            return 1
        print(f"{GEN_DIR} is up to date")
        return 0
    for path in generate():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
