"""The tiered-store client: one object store behind four operations, whatever the store is.

Sealed segments leave the brokers' disks for an object store (:mod:`tidelog.storage.remote_segment` says what is
written there and how it is read back). This module only reaches the store, through ``obstore`` (one API for the
local filesystem, S3 and S3-compatible servers, GCS and Azure), and turns its failures into this package's
errors:

- :meth:`TieredStore.put_new` writes an object *create-only* (``PutMode.CREATE``): an object is never
  overwritten. Finding the name taken is not an error but an answer (False): names are derived from the content
  (:func:`~tidelog.storage.remote_segment.object_stem`), so an object of the same name is the same bytes, which
  is how a new leader adopts what a deposed one uploaded instead of duplicating it.
- :meth:`get_range`, :meth:`get` read; a missing object is :class:`RemoteObjectMissingError`.
- :meth:`delete` removes an object (retention); one already gone is fine. :meth:`list_names` lists a prefix
  (a new leader's sweep of orphans).
- :meth:`check` proves, at start, that the credentials are accepted: a broker configured with a store that
  refuses it does not start (:class:`TieredStoreConfigError`, one line); a store that does not answer at all is
  an outage, not a mistake, and the broker starts anyway (uploads wait for it).

Store URLs: ``file:///absolute/path`` (the embedded default: no server at all) and ``s3://bucket[/prefix]``, with
the endpoint, region and credentials given beside it (:class:`StoreSettings`). Anything else is refused, never
guessed at. Every request is bounded in time (``timeout``) and retried by ``obstore`` a few times; the uploader
above adds its own backoff across rounds (:mod:`tidelog.broker.tiering`).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

from tidelog.storage.errors import StorageError

SUPPORTED = "file:///absolute/path or s3://bucket[/prefix]"


def _obstore() -> ModuleType:
    """``obstore``, imported on first use: a broker without a tiered store never loads it (about 7 MiB resident,
    docs/performance.md "Many partitions")."""
    import obstore.store

    return obstore


def _errors() -> ModuleType:
    import obstore.exceptions

    return obstore.exceptions


class TieredStoreError(StorageError):
    """The object store failed a request (unreachable, refused, timed out); the message says which and why."""


class TieredStoreConfigError(TieredStoreError, ValueError):
    """A tiered-store setting that cannot be used: a bad URL, an unreachable store, refused credentials."""


class RemoteObjectMissingError(TieredStoreError):
    """An object the segment list names is not in the store."""


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """Where the tiered store is and how to reach it (the broker's ``tiered_store*`` settings)."""

    url: str
    endpoint: str | None = None
    """An S3-compatible server's URL (``http://127.0.0.1:8333``); None: AWS's own endpoints."""
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = None
    timeout_ms: int = 30_000
    """Bound on each request; ``obstore`` retries within it."""


class TieredStore:
    """One object store under one key prefix. Build with :func:`open_store`."""

    def __init__(self, store: Any, prefix: str, description: str) -> None:
        self._store = store
        self._prefix = prefix.strip("/")
        self.description = description
        """The store as an operator names it (its URL), for messages."""

    def key(self, name: str) -> str:
        return f"{self._prefix}/{name}" if self._prefix else name

    async def put_new(self, name: str, data: bytes | memoryview) -> bool:
        """Write ``data`` as ``name`` unless that name exists: True if written, False if it was there already."""
        try:
            await _obstore().put_async(self._store, self.key(name), data, mode="create")
        except _errors().AlreadyExistsError:
            return False
        except Exception as exc:
            raise self._failed("put", name, exc) from None
        return True

    async def get(self, name: str) -> bytes:
        try:
            result = await _obstore().get_async(self._store, self.key(name))
            return bytes(await result.bytes_async())
        except (_errors().NotFoundError, FileNotFoundError):
            raise RemoteObjectMissingError(f"{self.description}: object {name} is missing") from None
        except Exception as exc:
            raise self._failed("get", name, exc) from None

    async def get_range(self, name: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of object ``name`` (fewer at its end)."""
        try:
            return bytes(await _obstore().get_range_async(self._store, self.key(name), start=start, end=end))
        except (_errors().NotFoundError, FileNotFoundError):
            raise RemoteObjectMissingError(f"{self.description}: object {name} is missing") from None
        except Exception as exc:
            raise self._failed("get", name, exc) from None

    async def size_of(self, name: str) -> int | None:
        """The object's size, None when there is none."""
        try:
            meta = await _obstore().head_async(self._store, self.key(name))
        except (_errors().NotFoundError, FileNotFoundError):
            return None
        except Exception as exc:
            raise self._failed("head", name, exc) from None
        return int(meta["size"])

    async def list_names(self, prefix: str) -> list[str]:
        """The names of the objects under ``prefix/`` (as given to :meth:`put_new`), in no particular order."""
        try:
            listed = await _obstore().list(self._store, prefix=self.key(prefix) + "/", chunk_size=1000).collect_async()
        except (_errors().NotFoundError, FileNotFoundError):
            return []
        except Exception as exc:
            raise self._failed("list", prefix, exc) from None
        cut = len(self.key(""))  # the store's own prefix and its slash, or nothing
        return [str(meta["path"])[cut:] for meta in listed]

    async def delete(self, name: str) -> None:
        try:
            await _obstore().delete_async(self._store, self.key(name))
        except (_errors().NotFoundError, FileNotFoundError):
            return
        except Exception as exc:
            raise self._failed("delete", name, exc) from None

    async def check(self) -> None:
        """Prove the store accepts the credentials (a listing of the prefix): :class:`TieredStoreConfigError` when
        it answers with a refusal (credentials, no such bucket, a directory it cannot use), :class:`TieredStoreError`
        when it does not answer at all (an outage: the broker starts anyway, and uploads wait for the store)."""
        try:
            await _obstore().list(self._store, prefix=self._prefix or None, chunk_size=1).collect_async()
        except (_errors().UnauthenticatedError, _errors().PermissionDeniedError) as exc:
            raise TieredStoreConfigError(
                f"tiered store {self.description} refused the credentials "
                f"(tiered_store_access_key_id / tiered_store_secret_access_key): {_first_line(exc)}"
            ) from None
        except Exception as exc:
            text = _first_line(exc)
            if "403" in str(exc) or "SignatureDoesNotMatch" in str(exc) or "InvalidAccessKeyId" in str(exc):
                raise TieredStoreConfigError(
                    f"tiered store {self.description} refused the credentials "
                    f"(tiered_store_access_key_id / tiered_store_secret_access_key): {text}"
                ) from None
            if "non-2xx status" in str(exc) or isinstance(exc, OSError):  # it answered, and refused
                raise TieredStoreConfigError(f"tiered store {self.description} cannot be used: {text}") from None
            raise TieredStoreError(f"tiered store {self.description} does not answer: {text}") from None

    def _failed(self, what: str, name: str, exc: BaseException) -> TieredStoreError:
        return TieredStoreError(f"{self.description}: {what} {name} failed: {_first_line(exc)}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def open_store(settings: StoreSettings) -> TieredStore:
    """The store ``settings.url`` names; :class:`TieredStoreConfigError` for a URL tidelog cannot use."""
    parts = urlsplit(settings.url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise TieredStoreConfigError(
                f"tiered_store {settings.url!r}: a file URL needs an absolute path ({SUPPORTED})"
            )
        root = Path(parts.path)
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TieredStoreConfigError(f"tiered_store {settings.url!r}: cannot create {root}: {exc}") from None
        return TieredStore(_obstore().store.LocalStore(root, mkdir=True), "", settings.url)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise TieredStoreConfigError(f"tiered_store {settings.url!r} names no bucket ({SUPPORTED})")
        if (settings.access_key_id is None) != (settings.secret_access_key is None):
            raise TieredStoreConfigError(
                "tiered_store_access_key_id and tiered_store_secret_access_key go together: set both or neither"
            )
        timeout = datetime.timedelta(milliseconds=settings.timeout_ms)
        options: dict[str, Any] = {"timeout": timeout, "connect_timeout": min(timeout, datetime.timedelta(seconds=5))}
        kwargs: dict[str, Any] = {"region": settings.region}
        if settings.endpoint:
            kwargs["endpoint"] = settings.endpoint
            options["allow_http"] = settings.endpoint.startswith("http://")
            kwargs["virtual_hosted_style_request"] = False
        if settings.access_key_id is not None:
            kwargs["access_key_id"] = settings.access_key_id
            kwargs["secret_access_key"] = settings.secret_access_key
        retry = {
            "max_retries": 3,
            "retry_timeout": timeout,
            "backoff": {
                "init_backoff": datetime.timedelta(milliseconds=100),
                "max_backoff": datetime.timedelta(seconds=2),
                "base": 2,
            },
        }
        try:
            store = _obstore().store.S3Store(parts.netloc, client_options=options, retry_config=retry, **kwargs)
        except Exception as exc:
            raise TieredStoreConfigError(f"tiered_store {settings.url!r}: {_first_line(exc)}") from None
        return TieredStore(store, parts.path, settings.url)
    raise TieredStoreConfigError(f"tiered_store {settings.url!r}: unsupported store; use {SUPPORTED}")
