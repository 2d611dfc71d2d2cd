"""NATS subject and ack checks: the rules, the limit, and error messages that never echo unbounded input."""

from __future__ import annotations

import pytest

from tidelog.protocol.errors import InvalidArgumentError
from tidelog.protocol.subjects import (
    MAX_SUBJECT_BYTES,
    QUOTE_CHARS,
    ack_problem,
    check_ack,
    check_subject,
    quote,
    subject_problem,
)


@pytest.mark.parametrize("subject", ["a", "orders.in", "_INBOX.abc123", "é.ü", "a-b_c.d", "x" * MAX_SUBJECT_BYTES])
def test_valid_subjects(subject: str) -> None:
    assert subject_problem(subject, wildcards=False) is None
    assert subject_problem(subject, wildcards=True) is None


@pytest.mark.parametrize("subject", ["a.*", "*.b", ">", "a.>", "a.*.>"])
def test_wildcards_only_where_a_subscription_allows_them(subject: str) -> None:
    assert subject_problem(subject, wildcards=True) is None
    assert "wildcard" in (subject_problem(subject, wildcards=False) or "")


@pytest.mark.parametrize(
    ("subject", "problem"),
    [
        ("", "empty"),
        ("a b", "whitespace"),
        ("a\nb", "whitespace"),
        ("a\x00b", "control"),
        ("a..b", "empty token"),
        ("a.", "empty token"),
        (".a", "empty token"),
        ("a.>.b", "'>' before its last token"),
        ("x" * (MAX_SUBJECT_BYTES + 1), f"the limit is {MAX_SUBJECT_BYTES}"),
        ("é" * (MAX_SUBJECT_BYTES // 2 + 1), "bytes long"),  # the limit is in UTF-8 bytes
    ],
)
def test_invalid_subjects(subject: str, problem: str) -> None:
    assert problem in (subject_problem(subject, wildcards=True) or "")


def test_errors_name_the_field_and_quote_a_bounded_part_of_the_input() -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        check_subject("y" * 100_000, "subject", wildcards=False)
    message = raised.value.message
    assert message.startswith("subject ") and "100000 characters" in message and len(message) < 300
    assert quote("short") == "'short'" and len(quote("z" * 10_000)) < QUOTE_CHARS + 40


@pytest.mark.parametrize(
    ("inbox", "policy", "field"),
    [("acks", 3, "ackPolicy"), ("acks", -1, "ackPolicy"), ("a b", 0, "ackInbox"), ("a.*", 1, "ackInbox")],
)
def test_ack_checks_name_the_field_and_the_allowed_values(inbox: str, policy: int, field: str) -> None:
    with pytest.raises(InvalidArgumentError, match=field):
        check_ack(inbox, policy)
    if field == "ackPolicy":
        assert "LEADER (0), ALL (1), NONE (2)" in (ack_problem(inbox, policy) or "")


@pytest.mark.parametrize(("inbox", "policy"), [("", 0), ("", 2), ("_INBOX.x", 1)])
def test_valid_acks(inbox: str, policy: int) -> None:
    check_ack(inbox, policy)
