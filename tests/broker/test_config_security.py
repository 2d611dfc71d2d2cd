"""The authorization settings: when authorization is on, what is refused, and how each value is read."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from tidelog.broker.config import load_config
from tidelog.broker.config_security import authorization_enabled
from tidelog.broker.config_values import BadConfigValueError


@pytest.fixture
def tls(tmp_path: Path) -> dict[str, str]:
    ca = trustme.CA()
    leaf = ca.issue_cert("localhost")
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem.bytes())
    (tmp_path / "b.pem").write_bytes(leaf.cert_chain_pems[0].bytes())
    (tmp_path / "b.key").write_bytes(leaf.private_key_pem.bytes())
    return {
        "TIDELOG_TLS_CERT": str(tmp_path / "b.pem"),
        "TIDELOG_TLS_KEY": str(tmp_path / "b.key"),
        "TIDELOG_TLS_CLIENT_CA": str(tmp_path / "ca.pem"),
    }


def test_off_by_default_and_on_by_default_once_client_certificates_are_required(tls: dict[str, str]) -> None:
    assert not authorization_enabled(load_config(env={}))
    assert not authorization_enabled(load_config(env={**tls, "TIDELOG_TLS_CLIENT_AUTH": "optional"}))
    assert authorization_enabled(load_config(env={**tls, "TIDELOG_TLS_CLIENT_AUTH": "required"}))
    off = load_config(env={**tls, "TIDELOG_TLS_CLIENT_AUTH": "required", "TIDELOG_AUTHZ_ENABLED": "false"})
    assert not authorization_enabled(off)
    on = load_config(env={**tls, "TIDELOG_TLS_CLIENT_AUTH": "optional", "TIDELOG_AUTHZ_ENABLED": "true"})
    assert authorization_enabled(on)
    assert load_config(env={"TIDELOG_AUTHZ_ENABLED": "auto"}).authz_enabled is None


def test_authorization_without_client_certificates_is_refused() -> None:
    with pytest.raises(BadConfigValueError, match=r"authz_enabled.*unless tls_client_auth is 'optional' or"):
        load_config(env={"TIDELOG_AUTHZ_ENABLED": "true"})


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"TIDELOG_AUTHZ_ENABLED": "maybe"}, "authz_enabled"),
        ({"TIDELOG_TLS_PRINCIPAL_FROM": "dn"}, "tls_principal_from"),
        ({"TIDELOG_SUPER_USERS": "admin,\x01bad"}, "super_users"),
    ],
)
def test_bad_values_name_the_key(env: dict[str, str], key: str) -> None:
    with pytest.raises(BadConfigValueError) as caught:
        load_config(env=env)
    assert caught.value.key == key


def test_lists_of_principals() -> None:
    config = load_config(env={"TIDELOG_SUPER_USERS": "admin, ops", "TIDELOG_BROKER_PRINCIPALS": "b1,b2"})
    assert config.super_users == ("admin", "ops") and config.broker_principals == ("b1", "b2")
