"""What a broker configuration value may be: the kinds that parse and check each key's values, and the errors that
refuse a key or a value (naming the key, where it came from, and what would be accepted).

:class:`~tidelog.broker.config.BrokerConfig` declares each key with :func:`setting` and one of these kinds; a kind
raises :class:`Bad`, which the configuration turns into :class:`BadConfigValueError` where the key and its source
are known.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeVar
from urllib.parse import urlsplit

ENV_PREFIX: Final = "TIDELOG_"

_T = TypeVar("_T")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


# ---- errors ----


class ConfigError(ValueError):
    """The configuration cannot be used; the message says which key, from where, and what would be accepted."""


REMOVED_KEYS = {
    "fsync_io_uring": "removed: every fsync runs on worker threads now (io_uring rounds could hang); delete the key",
}
"""Keys earlier versions accepted, with why they went: refused like any unknown key, but saying so."""


class UnknownConfigKeyError(ConfigError):
    def __init__(self, key: str, source: str, allowed: tuple[str, ...], *, noun: str = "key") -> None:
        self.key = key
        self.source = source
        self.allowed = allowed
        removed = REMOVED_KEYS.get(key.lower().removeprefix(ENV_PREFIX.lower()))
        close = difflib.get_close_matches(key, allowed, n=1)
        hint = f" ({removed})" if removed else f" (did you mean {close[0]!r}?)" if close else ""
        super().__init__(
            f"unknown configuration {noun} {key!r} in {source}{hint}; allowed {noun}s: {', '.join(allowed)}"
        )


class BadConfigValueError(ConfigError):
    def __init__(self, key: str, source: str, value: object, expected: str) -> None:
        self.key = key
        self.source = source
        self.value = value
        self.expected = expected
        super().__init__(f"bad value for {key!r} in {source}: {value!r}; expected {expected}")


class BrokerIdMismatchError(ConfigError):
    def __init__(self, configured: str, stored: str, path: Path) -> None:
        self.configured = configured
        self.stored = stored
        self.path = path
        super().__init__(
            f"broker id {configured!r} does not match {stored!r} stored in {path}: that data directory belongs to "
            f"broker {stored!r}. Start with id {stored!r}, or use another data_dir for a new broker."
        )


class Bad(Exception):
    """A value a kind refuses; turned into :class:`BadConfigValueError` where the key and source are known."""

    def __init__(self, expected: str) -> None:
        super().__init__(expected)
        self.expected = expected


# ---- value kinds: how each key's values are parsed and checked ----


@dataclass(frozen=True, slots=True)
class Kind:
    """Parses a value from any layer and checks it. Strings are parsed as text (the environment gives nothing
    else, and a TOML ``port = "9292"`` is meant as a number); other values must already have the right type."""

    expected: str
    parse: Callable[[object], object]


def int_kind(low: int, high: int | None = None) -> Kind:
    expected = f"an integer from {low} to {high}" if high is not None else f"an integer of at least {low}"

    def parse(raw: object) -> object:
        if isinstance(raw, str):
            try:
                raw = int(raw.strip(), 10)
            except ValueError:
                raise Bad(expected) from None
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < low or (high is not None and raw > high):
            raise Bad(expected)
        return raw

    return Kind(expected, parse)


def bool_kind() -> Kind:
    expected = "true or false"

    def parse(raw: object) -> object:
        if isinstance(raw, str):
            text = raw.strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
        if not isinstance(raw, bool):
            raise Bad(expected)
        return raw

    return Kind(expected, parse)


def auto_bool_kind() -> Kind:
    """``true``/``false``, or ``auto`` (None: the broker decides from other settings)."""
    expected = "true, false or auto"
    boolean = bool_kind()

    def parse(raw: object) -> object:
        if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("auto", "")):
            return None
        try:
            return boolean.parse(raw)
        except Bad:
            raise Bad(expected) from None

    return Kind(expected, parse)


def choice_kind(*choices: str) -> Kind:
    expected = "one of " + ", ".join(repr(choice) for choice in choices)

    def parse(raw: object) -> object:
        if not isinstance(raw, str) or raw.strip().lower() not in choices:
            raise Bad(expected)
        return raw.strip().lower()

    return Kind(expected, parse)


def text_kind(expected: str, check: Callable[[str], bool], *, optional: bool = False) -> Kind:
    def parse(raw: object) -> object:
        if raw is None and optional:
            return None
        if not isinstance(raw, str):
            raise Bad(expected)
        text = raw.strip()
        if not text and optional:
            return None
        if not check(text):
            raise Bad(expected)
        return text

    return Kind(expected + (" (empty: unset)" if optional else ""), parse)


def path_kind() -> Kind:
    expected = "a directory path"

    def parse(raw: object) -> object:
        if not isinstance(raw, str | os.PathLike) or not os.fspath(raw):
            raise Bad(expected)
        return Path(os.fspath(raw)).expanduser()

    return Kind(expected, parse)


def file_kind(what: str) -> Kind:
    """An optional file path (empty or None: unset); whether the file exists and loads is checked when it is
    used, so a reload can pick up a file written later."""
    expected = f"a path to {what} (empty: unset)"

    def parse(raw: object) -> object:
        if raw is None:
            return None
        if not isinstance(raw, str | os.PathLike):
            raise Bad(expected)
        text = os.fspath(raw).strip()
        return Path(text).expanduser() if text else None

    return Kind(expected, parse)


def list_kind(expected_item: str, check: Callable[[str], bool]) -> Kind:
    expected = f"a list of {expected_item} (in the environment: comma-separated)"

    def parse(raw: object) -> object:
        items: list[object]
        if isinstance(raw, str):
            items = [item for item in raw.split(",") if item.strip()]
        elif isinstance(raw, list | tuple):
            items = list(raw)
        else:
            raise Bad(expected)
        if not all(isinstance(item, str) and check(item.strip()) for item in items):
            raise Bad(expected)
        return tuple(str(item).strip() for item in items)

    return Kind(expected, parse)


def is_principal(text: str) -> bool:
    """A principal's name in a setting: not empty, no comma (lists are comma-separated), no control character."""
    return bool(text) and "," not in text and text.isprintable()


def is_host(text: str) -> bool:
    return bool(text) and not any(ch.isspace() or ch in "/@" for ch in text)


def is_nats_url(text: str) -> bool:
    if "://" not in text:
        return is_host(text.rsplit(":", 1)[0])
    parts = urlsplit(text)
    return parts.scheme in {"nats", "tls", "ws", "wss"} and bool(parts.hostname)


def parse_etcd_endpoint(endpoint: str) -> tuple[str, int]:
    """``http(s)://host:port`` or ``host[:port]`` → ``(host, port)``; port 2379 if absent.

    The etcd client takes a host and a port, while users and ``EmbeddedEtcd`` speak in URLs. Whether the link is
    TLS is the ``etcd_tls_*`` settings' business; the configuration refuses an ``https://`` endpoint without them
    (:class:`~tidelog.broker.config.BrokerConfig`), so that a TLS endpoint is never dialled in clear.
    """
    text = endpoint.strip()
    parts = urlsplit(text if "://" in text else f"http://{text}")
    if parts.scheme not in {"http", "https"} or not parts.hostname or parts.path not in {"", "/"}:
        raise ValueError(f"not an etcd endpoint: {endpoint!r}")
    try:
        port = parts.port or 2379
    except ValueError:
        raise ValueError(f"bad port in etcd endpoint {endpoint!r}") from None
    return parts.hostname, port


def is_etcd_endpoint(text: str) -> bool:
    try:
        parse_etcd_endpoint(text)
    except ValueError:
        return False
    return True


def setting(default: _T, kind: Kind, doc: str) -> _T:
    """A configuration field: its default, how its values are parsed and checked, and what it is for."""
    return field(default=default, metadata={"kind": kind, "doc": doc})


PORT = int_kind(0, 65535)
POSITIVE = int_kind(1)
NON_NEGATIVE = int_kind(0)
