"""The repository's documents point only at files inside the repository, and those files exist: a contributor who
clones it has everything they link to."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted([ROOT / "README.md", ROOT / "DEVELOPERS.md", *(ROOT / "docs").rglob("*.md")])
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_RELATIVE_SPAN = re.compile(r"`(\.\./[^`\s]+)`")
_EXTERNAL = ("http://", "https://", "mailto:", "#")


def references(document: Path) -> list[str]:
    text = document.read_text()
    links = [link for link in _LINK.findall(text) if not link.startswith(_EXTERNAL)]
    return [link.split("#", 1)[0] for link in links] + _RELATIVE_SPAN.findall(text)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_reference_is_a_file_inside_the_repository(document: Path) -> None:
    for reference in references(document):
        target = (document.parent / reference).resolve()
        assert target.is_relative_to(ROOT), f"{reference} points outside the repository"
        assert target.exists(), f"{reference} does not exist"


def test_developers_guide_points_at_the_architecture_in_the_repository() -> None:
    assert "docs/architecture.md" in references(ROOT / "DEVELOPERS.md")
