"""Where configuration values come from: the layers (TOML file, environment, ``-s`` settings, flags), and the
broker id kept in the data directory.

Later layers win, key by key::

    defaults  <  TOML file (--config)  <  TIDELOG_* environment variables  <  command-line flags

A key has one name everywhere: ``wire_port`` in the TOML file, ``TIDELOG_WIRE_PORT`` in the environment, and
``wire_port`` in the flags mapping (the CLI turns ``--wire-port`` into it). The TOML file is flat (no tables).
In the environment, lists are comma-separated (``TIDELOG_NATS_SERVERS=nats://a:4222,nats://b:4222``) and
booleans are ``true``/``false`` (or ``1``/``0``, ``yes``/``no``, ``on``/``off``). An empty value for an optional
key (``id``, ``advertise_host``) means "unset".

Mistakes are refused before the broker starts, because a typo that silently falls back to a default (a
``retention_max_age`` that never applies) is found only when data is lost:

- an unknown key, in the file or as a ``TIDELOG_*`` variable, raises :class:`UnknownConfigKeyError` naming it
  and listing the allowed keys;
- a bad value raises :class:`BadConfigValueError` naming the key, where it came from, the value and what is
  allowed.

Both are :class:`~tidelog.broker.config_values.ConfigError`, a :class:`ValueError` (the kinds of values and these
errors are :mod:`tidelog.broker.config_values`). The environment variable ``TIDELOG_CONFIG`` names the TOML
file when no ``--config`` is given; it is the only ``TIDELOG_*`` variable that is not a key.

This module works on the keys' dataclass fields, so that it sits below :mod:`tidelog.broker.config`, which builds
the :class:`~tidelog.broker.config.BrokerConfig` from what :func:`layered_values` returns.
"""

from __future__ import annotations

import os
import re
import secrets
import tomllib
from collections.abc import Mapping
from dataclasses import Field
from pathlib import Path
from typing import Any, Final

from tidelog.broker.config_values import (
    ENV_PREFIX,
    Bad,
    BadConfigValueError,
    BrokerIdMismatchError,
    ConfigError,
    UnknownConfigKeyError,
)
from tidelog.storage.atomic import write_atomically

__all__ = [
    "BROKER_ID_FILE",
    "CLIENT_ENV",
    "CONFIG_FILE_ENV",
    "ID_PATTERN",
    "layered_values",
    "settle_broker_id",
]

CONFIG_FILE_ENV: Final = "TIDELOG_CONFIG"
CLIENT_ENV: Final = frozenset(
    {
        "TIDELOG_BROKERS",
        "TIDELOG_CLIENT_TLS_CA",
        "TIDELOG_CLIENT_TLS_CERT",
        "TIDELOG_CLIENT_TLS_KEY",
        "TIDELOG_CLIENT_USER",
        "TIDELOG_CLIENT_PASSWORD",
        "TIDELOG_CLIENT_PASSWORD_FILE",
    }
)
"""``TIDELOG_*`` variables read by the client commands, not the broker: the broker ignores them."""
BROKER_ID_FILE: Final = "broker-id"
ID_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
"""A broker id: 1-64 letters, digits, '_' or '-', starting with a letter or digit."""

Fields = Mapping[str, "Field[Any]"]


def layered_values(
    fields: Fields,
    config_file: Path | None,
    *,
    env: Mapping[str, str] | None,
    flags: Mapping[str, object] | None,
    settings: Mapping[str, str] | None,
) -> dict[str, object]:
    """Every key some layer sets, to its parsed value (later layers win): the TOML ``config_file`` (else the one
    ``TIDELOG_CONFIG`` names), ``TIDELOG_*`` variables of ``env`` (default: the process environment), ``settings``
    and ``flags`` (``None`` values count as not given). ``fields`` are the keys, by name."""
    environment: Mapping[str, str] = os.environ if env is None else env
    values: dict[str, object] = {}
    if config_file is None and environment.get(CONFIG_FILE_ENV, "").strip():
        config_file = Path(environment[CONFIG_FILE_ENV].strip()).expanduser()
    if config_file is not None:
        values.update(_from_toml(fields, config_file))
    values.update(_from_env(fields, environment))
    values.update({key: _coerce(fields, key, raw, f"-s {key}={raw}") for key, raw in (settings or {}).items()})
    values.update(_from_flags(fields, flags or {}))
    return values


def _coerce(fields: Fields, key: str, raw: object, source: str) -> object:
    each = fields.get(key)
    if each is None:
        raise UnknownConfigKeyError(key, source, tuple(fields))
    try:
        return each.metadata["kind"].parse(raw)
    except Bad as bad:
        raise BadConfigValueError(key, source, raw, bad.expected) from None


def _from_toml(fields: Fields, path: Path) -> dict[str, object]:
    source = f"config file {path}"
    try:
        with path.open("rb") as file:
            document: dict[str, Any] = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"cannot read {source}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source} is not valid TOML: {exc}") from exc
    return {key: _coerce(fields, key, raw, source) for key, raw in document.items()}


def _from_env(fields: Fields, environment: Mapping[str, str]) -> dict[str, object]:
    values: dict[str, object] = {}
    for name, raw in environment.items():
        if not name.startswith(ENV_PREFIX) or name == CONFIG_FILE_ENV or name in CLIENT_ENV:
            continue
        key = name.removeprefix(ENV_PREFIX).lower()
        if key not in fields:
            allowed = (*(ENV_PREFIX + each.upper() for each in fields), CONFIG_FILE_ENV)
            raise UnknownConfigKeyError(name, "the environment", allowed, noun="variable")
        values[key] = _coerce(fields, key, raw, f"environment variable {name}")
    return values


def _from_flags(fields: Fields, flags: Mapping[str, object]) -> dict[str, object]:
    return {
        key: _coerce(fields, key, raw, f"flag --{key.replace('_', '-')}")
        for key, raw in flags.items()
        if raw is not None
    }


# ---- the persisted broker id ----


def settle_broker_id(data_dir: Path, configured: str | None) -> str:
    """The broker id to run with, settled against ``<data_dir>/broker-id``.

    - no id configured: the stored id, or a new one that is stored now, so restarts keep the identity that etcd
      metadata (replica lists, ISRs, leaders) refers to;
    - an id configured and none stored: it is stored, so a later start without ``--id`` keeps it;
    - an id configured that differs from the stored one: :class:`BrokerIdMismatchError`, since serving this
      directory's replicas under another identity would make them count twice.
    """
    path = data_dir / BROKER_ID_FILE
    stored = _read_broker_id(path)
    if stored is not None:
        if configured is not None and configured != stored:
            raise BrokerIdMismatchError(configured, stored, path)
        return stored
    broker_id = configured if configured is not None else secrets.token_hex(8)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, (broker_id + "\n").encode())
    return broker_id


def _read_broker_id(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    if ID_PATTERN.fullmatch(text) is None:
        raise ConfigError(f"{path} does not hold a valid broker id: {text[:80]!r}")
    return text
