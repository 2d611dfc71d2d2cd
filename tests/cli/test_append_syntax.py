"""The text syntax of registers in ``tidelog append``: labels and selectors, and what it refuses."""

from __future__ import annotations

import click
import pytest

from tidelog.cli.append import parse_labels, parse_selector, show_labels
from tidelog.protocol.labels import LabelSelector, LabelSet


def test_labels() -> None:
    assert parse_labels("author=a,zone=eu", "--x") == LabelSet.of(("author", "a"), ("zone", "eu"))
    assert parse_labels(" zone=eu , author=a ", "--x") == LabelSet.of(("author", "a"), ("zone", "eu"))
    assert parse_labels("lock,held=", "--x") == LabelSet.of(("lock", ""), ("held", ""))
    assert parse_labels("zone=eu,zone=us", "--x") == LabelSet.of(("zone", "eu"), ("zone", "us"))
    assert parse_labels("", "--x") == LabelSet()


def test_selectors() -> None:
    expected = LabelSelector(LabelSet.of(("author", "a")), LabelSet.of(("frozen", ""), ("zone", "eu")))
    assert parse_selector("author=a,!frozen,!zone=eu", "--x") == expected
    assert parse_selector("author=a,frozen!,zone!=eu", "--x") == expected  # as tidelog prints selectors
    assert parse_selector("", "--x") == LabelSelector()


def test_shown_labels_parse_back() -> None:
    labels = LabelSet.of(("author", "a"), ("lock", ""), ("zone", "eu"))
    assert parse_labels(show_labels(labels), "--x") == labels
    assert show_labels(LabelSet()) == "(none)"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("a=1", "length 1"),
        ("author=a b", "character ' '"),
        ("lock,lock=x", "both an empty and other values"),
        ("!author=a", "selector"),
        (",".join(f"name{i}=v" for i in range(65)), "more than 64"),
    ],
)
def test_bad_labels_name_the_option(text: str, reason: str) -> None:
    with pytest.raises(click.BadParameter) as refused:
        parse_labels(text, "--union-registers")
    assert refused.value.param_hint == "--union-registers" and reason in refused.value.format_message()
