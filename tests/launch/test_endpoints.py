"""The endpoints file a broker leaves in its data directory: written whole, read back, ignored once stale."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tidelog.launch.endpoints import ENDPOINTS_FILE, Endpoints, read_endpoints, remove_endpoints, write_endpoints


def ours(**changes: object) -> Endpoints:
    fields: dict[str, object] = {
        "broker_id": "b1",
        "pid": os.getpid(),
        "grpc": "127.0.0.1:9292",
        "wire": "127.0.0.1:9293",
        "nats": ["nats://127.0.0.1:4222"],
        "etcd": ["http://127.0.0.1:2379"],
    }
    fields.update(changes)
    return Endpoints(**fields)  # type: ignore[arg-type]


def dead_pid() -> int:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    return int(child.stdout)  # reaped by run(): no process has it now (reuse within the test is not a concern)


def test_written_whole_and_read_back(tmp_path: Path) -> None:
    path = write_endpoints(tmp_path, ours())
    assert path == tmp_path / ENDPOINTS_FILE
    assert json.loads(path.read_text())["etcd"] == ["http://127.0.0.1:2379"]
    assert read_endpoints(tmp_path) == ours()
    assert [p.name for p in tmp_path.iterdir()] == [ENDPOINTS_FILE]  # no temporary file left behind


def test_missing_unreadable_or_stale_files_give_nothing(tmp_path: Path) -> None:
    assert read_endpoints(tmp_path) is None
    (tmp_path / ENDPOINTS_FILE).write_text("{not json")
    assert read_endpoints(tmp_path) is None
    write_endpoints(tmp_path, ours(pid=dead_pid()))
    assert read_endpoints(tmp_path) is None


def test_removed_only_by_the_process_that_wrote_it(tmp_path: Path) -> None:
    write_endpoints(tmp_path, ours(pid=dead_pid()))
    remove_endpoints(tmp_path)  # another broker's (stale) file: left for that broker's data dir owner
    assert (tmp_path / ENDPOINTS_FILE).exists()
    write_endpoints(tmp_path, ours())
    remove_endpoints(tmp_path)
    assert not (tmp_path / ENDPOINTS_FILE).exists()
