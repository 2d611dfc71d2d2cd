"""Cluster namespaces: several tidelog clusters on one etcd and one NATS without seeing each other.

A cluster's ``namespace`` (a broker setting, Liftbridge's ``clustering.namespace``) names everything the cluster
keeps outside itself: every etcd key lives under ``/{namespace}/`` (:class:`~tidelog.metadata.records.Keys`),
and the NATS subjects of its internal streams (``__cursors``, ``__activity``) are ``_{namespace}.{name}``, so two
clusters never read each other's metadata nor store each other's internal records. The default, ``tidelog``,
gives the keys and subjects tidelog has always used, so an existing cluster keeps its data.

Streams' own subjects are the user's: two clusters whose streams are bound to one subject both store what is
published there, as two Liftbridge clusters would. Streams of one ``group`` share the subject's messages through a
NATS queue group; :func:`queue_group` names it for the namespace too, so that a group of one cluster never takes
messages away from a group of the same name in another.
"""

from __future__ import annotations

import re
from typing import Final

from tidelog.metadata.records import Keys

DEFAULT_NAMESPACE: Final = "tidelog"
NAMESPACE_RULE: Final = "1-64 letters, digits, '_' or '-', starting with a letter or digit"
_NAMESPACE_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
"""An etcd key segment and one NATS subject token: no '/', '.', wildcards or spaces."""


def is_namespace(text: str) -> bool:
    return _NAMESPACE_RE.fullmatch(text) is not None


def check_namespace(text: str) -> str:
    """``text`` when it is a valid namespace; otherwise :class:`ValueError` naming the rule."""
    if not is_namespace(text):
        raise ValueError(f"invalid namespace {text!r}: use {NAMESPACE_RULE}")
    return text


def namespace_keys(namespace: str = DEFAULT_NAMESPACE) -> Keys:
    """The etcd keys of the cluster named ``namespace``: every one under ``/{namespace}/``."""
    return Keys(f"/{check_namespace(namespace)}")


def internal_subject(namespace: str, name: str) -> str:
    """The NATS subject of the internal stream ``name`` (``cursors``, ``activity``) of cluster ``namespace``.

    Nothing is meant to publish there (the controller appends to internal streams directly); the partition leaders
    listen as for any stream, so the subject must differ between clusters sharing a NATS."""
    return f"_{check_namespace(namespace)}.{name}"


def queue_group(namespace: str, group: str) -> str | None:
    """The NATS queue group of the stream group ``group`` in cluster ``namespace`` (None: the stream has no group).

    The group itself in the default namespace (what tidelog always used, so brokers of a cluster being upgraded
    one by one keep sharing their queue group), ``{namespace}.{group}`` in any other."""
    if not group:
        return None
    return group if namespace == DEFAULT_NAMESPACE else f"{check_namespace(namespace)}.{group}"
