"""Namespaces name a cluster's etcd keys and internal subjects; the default keeps tidelog's original ones."""

from __future__ import annotations

import pytest

from tidelog.broker.config import load_config
from tidelog.broker.config_values import BadConfigValueError
from tidelog.metadata.namespace import DEFAULT_NAMESPACE, internal_subject, namespace_keys, queue_group


def test_the_default_namespace_keeps_the_original_keys_and_subjects() -> None:
    keys = namespace_keys(DEFAULT_NAMESPACE)
    assert keys.prefix == "/tidelog" and keys.stream("s") == b"/tidelog/streams/s"
    assert internal_subject(DEFAULT_NAMESPACE, "cursors") == "_tidelog.cursors"


def test_every_key_of_a_namespace_is_under_it() -> None:
    keys = namespace_keys("team-a")
    built = [keys.broker("b"), keys.stream("s"), keys.partition("s", 0), keys.controller(), keys.producer("p")]
    assert all(key.startswith(b"/team-a/") for key in built)
    assert internal_subject("team-a", "activity") == "_team-a.activity"


@pytest.mark.parametrize("bad", ["", "a/b", "a.b", "a b", "*", ">", "-lead", "x" * 65])
def test_a_namespace_that_cannot_be_a_key_segment_and_a_subject_token_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        namespace_keys(bad)
    with pytest.raises(BadConfigValueError, match="namespace"):
        load_config(env={"TIDELOG_NAMESPACE": bad} if bad else {"TIDELOG_NAMESPACE": " "})


def test_stream_groups_get_queue_groups_of_their_namespace() -> None:
    assert queue_group(DEFAULT_NAMESPACE, "workers") == "workers"
    assert queue_group("team-a", "workers") == "team-a.workers"
    assert queue_group("team-a", "") is None
