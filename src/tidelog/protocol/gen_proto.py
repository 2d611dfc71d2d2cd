"""Regenerate the Python modules of the ``proto/`` files into ``_gen/``: ``python -m tidelog.protocol.gen_proto``.

The generated files are checked in, so a fresh clone imports them without running protoc; this module is the one
command that rebuilds them, and ``--check`` tells CI whether the checked-in files still match the ``.proto``.

Placement follows protoc's: a proto's modules land in ``_gen/`` under the proto's own directory, so
``proto/api.proto`` (package ``proto``, the Liftbridge API) gives ``tidelog.protocol._gen.api_pb2`` and
``proto/tidelog/v1/append.proto`` (package ``tidelog.v1``) gives ``tidelog.protocol._gen.tidelog.v1.append_pb2``. The
proto paths are what other languages import too, so they stay as the package names say; each generated
subdirectory gets an ``__init__.py`` so it imports as a package.

protoc writes imports between generated modules as absolute ones rooted at ``_gen/`` (``import api_pb2``,
``from tidelog.v1 import append_pb2``), which only work when ``_gen/`` itself is on ``sys.path``. The broker
imports them as ``tidelog.protocol._gen…``, so imports between modules of one directory are rewritten to relative ones
after each generation; the rewrite fails loudly if a future grpcio-tools stops emitting the expected line in a
gRPC module.

Usage::

    python -m tidelog.protocol.gen_proto           # regenerate and patch
    python -m tidelog.protocol.gen_proto --check   # exit 1 if the checked-in files are stale
"""

from __future__ import annotations

import argparse
import importlib.resources
import re
import sys
import tempfile
from pathlib import Path, PurePosixPath

PROTOCOL_DIR = Path(__file__).resolve().parent
PROTO_DIR = PROTOCOL_DIR / "proto"
GEN_DIR = PROTOCOL_DIR / "_gen"
PROTO_FILES = ("api.proto", "tidelog/v1/append.proto", "tidelog/v1/admin.proto")

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


def _module_of(proto: str) -> tuple[str, str]:
    """The package directory and module name protoc gives a proto: ``("tidelog/v1", "append_pb2")``."""
    path = PurePosixPath(proto)
    parent = "" if str(path.parent) == "." else str(path.parent)
    return parent, path.stem.replace("-", "_") + "_pb2"


def _absolute_import(package_dir: str, module: str) -> str:
    """How protoc imports a generated module from another: ``import api_pb2``, ``from tidelog.v1 import …``."""
    return f"import {module}" if not package_dir else f"from {package_dir.replace('/', '.')} import {module}"


def _write_package_inits(out_dir: Path) -> None:
    """Make every generated subdirectory a package (protoc writes none)."""
    for proto in PROTO_FILES:
        package_dir, _ = _module_of(proto)
        parts = PurePosixPath(package_dir).parts
        for depth in range(1, len(parts) + 1):
            init = out_dir.joinpath(*parts[:depth], "__init__.py")
            package = ".".join(parts[:depth])
            init.write_text(
                f'"""Generated modules of package ``{package}`` (``proto/{"/".join(parts[:depth])}/``): see '
                '``tidelog.protocol._gen``."""\n',
                encoding="utf-8",
            )


def _patch_grpc_imports(out_dir: Path) -> None:
    """Turn protoc's absolute imports between generated modules of one directory into relative ones.

    ``import api_pb2 as api__pb2`` becomes ``from . import api_pb2 as api__pb2``, and
    ``from tidelog.v1 import append_pb2 as …`` becomes ``from . import append_pb2 as …``, in every generated
    module and stub. Each gRPC module must import its own messages that way, or protoc changed and we say so.
    """
    modules = [_module_of(proto) for proto in PROTO_FILES]
    for proto in PROTO_FILES:
        package_dir, module = _module_of(proto)
        directory = out_dir.joinpath(*PurePosixPath(package_dir).parts)
        grpc_file = directory / f"{module}_grpc.py"
        own = f"{_absolute_import(package_dir, module)} as "
        if own not in grpc_file.read_text(encoding="utf-8"):
            raise ProtoGenerationError(
                f"{grpc_file.name}: expected a line starting {own.strip()!r} to rewrite; protoc changed?"
            )
        siblings = [name for where, name in modules if where == package_dir]
        for path in (directory / f"{module}.py", directory / f"{module}.pyi", grpc_file):
            text = path.read_text(encoding="utf-8")
            for sibling in siblings:
                absolute = re.escape(_absolute_import(package_dir, sibling))
                text = re.sub(rf"^{absolute} as ", f"from . import {sibling} as ", text, flags=re.MULTILINE)
            path.write_text(text, encoding="utf-8")


def _generated_files(directory: Path) -> dict[str, bytes]:
    """Generated files under ``directory`` by path relative to it: the modules, stubs and subpackage
    ``__init__.py`` files (``_gen/__init__.py`` itself is written by hand)."""
    files: dict[str, bytes] = {}
    for path in sorted(directory.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        if path.name.endswith(_GENERATED_SUFFIXES) or (path.name == "__init__.py" and path.parent != directory):
            files[path.relative_to(directory).as_posix()] = path.read_bytes()
    return files


def generate(out_dir: Path = GEN_DIR) -> list[Path]:
    """Regenerate and patch the modules into ``out_dir``; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _protoc(out_dir)
    _write_package_inits(out_dir)
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
    parser = argparse.ArgumentParser(prog="python -m tidelog.protocol.gen_proto", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether the checked-in files are stale")
    options = parser.parse_args(argv)
    if options.check:
        stale = stale_files()
        if stale:
            print(f"stale generated files in {GEN_DIR}: {', '.join(stale)}", file=sys.stderr)
            print("regenerate with: python -m tidelog.protocol.gen_proto", file=sys.stderr)
            return 1
        print(f"{GEN_DIR} is up to date")
        return 0
    for path in generate():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
