"""The one-step password check behind gRPC logins: it agrees with the stored SCRAM credentials, tells a wrong
password and an unknown user apart in nothing, remembers a success only for its time, and never a failure."""

from __future__ import annotations

import pytest

from tidelog.api.password_check import LoginFailed, PasswordCheck, password_matches
from tidelog.api.principals import Principal
from tidelog.metadata.user_records import make_user

ALICE = make_user("alice", "correct horse", iterations=4096)
ODD = make_user("ops.bob", "pässwörd\u00a0x", iterations=4096)  # a password SASLprep changes


def test_the_check_agrees_with_the_stored_credentials() -> None:
    assert password_matches("alice", "correct horse", ALICE.auth_info())
    assert not password_matches("alice", "correct horse ", ALICE.auth_info())
    assert password_matches("ops.bob", "pässwörd\u00a0x", ODD.auth_info())
    assert password_matches("ops.bob", "pässwörd x", ODD.auth_info())  # SASLprep: no-break space is a space


async def test_a_success_is_remembered_for_its_time_only() -> None:
    users = {"alice": ALICE.auth_info()}
    lookups: list[str] = []

    async def lookup(name: str) -> tuple[bytes, bytes, bytes, int] | None:
        lookups.append(name)
        return users.get(name)

    remembering = PasswordCheck(lookup, remember=3600)
    assert await remembering.principal("alice", "correct horse") == Principal("alice")
    assert await remembering.principal("alice", "correct horse") == Principal("alice")
    assert lookups == ["alice"]

    forgetting = PasswordCheck(lookup, remember=0)
    assert await forgetting.principal("alice", "correct horse") == Principal("alice")
    del users["alice"]  # tidelog user delete alice
    with pytest.raises(LoginFailed, match="login failed for user 'alice': wrong password or no such user"):
        await forgetting.principal("alice", "correct horse")


async def test_failures_are_not_remembered() -> None:
    async def lookup(name: str) -> tuple[bytes, bytes, bytes, int] | None:
        return ALICE.auth_info() if name == "alice" else None

    check = PasswordCheck(lookup, remember=3600)
    for user, password in (("alice", "wrong"), ("nobody", "correct horse"), ("alice", "wrong")):
        with pytest.raises(LoginFailed, match=f"login failed for user '{user}': wrong password or no such user"):
            await check.principal(user, password)
    assert await check.principal("alice", "correct horse") == Principal("alice")
    assert not (await check.principal("alice", "correct horse")).broker
