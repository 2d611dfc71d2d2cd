"""How listing commands show what they found: tables that fit the terminal (80 columns when piped), or JSON.

Broker ids are 16 hex digits, and a partition row names up to three of them twice (replicas, ISR): in full they
cannot fit 80 columns. So tables show each id by its shortest prefix (at least :data:`SHORT_ID` characters)
that no other id shown shares, lists are comma-and-space separated so a cell wraps between ids rather than
cutting one, and numbers never wrap. ``--wide`` shows full ids; ``--output json`` shows every field in full,
for scripts (one JSON document on stdout).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
from rich import box
from rich.console import Console
from rich.table import Table

SHORT_ID = 6


def short_ids(ids: Iterable[str], wide: bool = False) -> dict[str, str]:
    """Each id → its shortest prefix of at least :data:`SHORT_ID` characters shared by no other (``wide``: itself)."""
    unique = sorted(set(ids))
    if wide:
        return {i: i for i in unique}
    shown: dict[str, str] = {}
    for i in unique:
        length = SHORT_ID
        while length < len(i) and any(o != i and o.startswith(i[:length]) for o in unique):
            length += 1
        shown[i] = i[:length]
    return shown


def id_list(ids: Iterable[str], names: Mapping[str, str]) -> str:
    return ", ".join(names.get(i, i) for i in ids)


def table(*columns: str, numeric: Iterable[str] = (), title: str | None = None) -> Table:
    """A table in the project's style: a light frame, ``numeric`` columns right-aligned and never wrapped, the
    others folded (never cut with an ellipsis) when the terminal is narrow."""
    numbers = set(numeric)
    out = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", pad_edge=False, show_edge=False)
    for column in columns:
        if column in numbers:
            out.add_column(column, justify="right", no_wrap=True)
        else:
            out.add_column(column, overflow="fold")
    return out


def plain(value: Any) -> Any:
    """``value`` with msgspec structs (wire headers are positional arrays) turned into dicts by field name."""
    if isinstance(value, msgspec.Struct):
        return {name: plain(getattr(value, name)) for name in value.__struct_fields__}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def print_json(value: Any) -> None:
    """``value`` as one indented JSON document on stdout."""
    sys.stdout.write(json.dumps(plain(value), indent=2) + "\n")
    sys.stdout.flush()


def console() -> Console:
    """A console on stdout: the terminal's width, or 80 columns when piped (rich's default)."""
    return Console()
