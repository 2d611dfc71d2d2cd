"""The queue checker on hand-made histories: one clean, and one for each anomaly of Jepsen's vocabulary that
contains it (and nothing else, where the anomaly allows)."""

from __future__ import annotations

from tidelog.testing.queue_checker import ANOMALIES, Outcome, QueueHistory, QueueReport

OK, FAIL, INFO = Outcome.OK, Outcome.FAIL, Outcome.INFO
S = "orders"


def _only(report: QueueReport, anomaly: str, count: int = 1) -> None:
    assert report.counts[anomaly] == count, str(report)
    others = {name: n for name, n in report.counts.items() if name != anomaly and n}
    assert not others, str(report)
    assert report.examples[anomaly]


def _clean() -> QueueHistory:
    """Two producers, one consumer, two replicas: everything acknowledged is read once, in order, everywhere."""
    history = QueueHistory()
    for offset, (process, value) in enumerate([("p1", b"a"), ("p2", b"b"), ("p1", b"c"), ("p2", b"d")]):
        history.send(process, S, 0, value, OK, offset)
    history.send("p1", S, 0, b"refused", FAIL)
    history.send("p2", S, 0, b"maybe", INFO)
    history.poll("c1", S, 0, [(0, b"a"), (1, b"b")])
    history.high_watermark("c1", S, 0, 2)
    history.poll("c1", S, 0, [(2, b"c"), (3, b"d")])
    history.high_watermark("c1", S, 0, 4)
    log = [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]
    history.replica("b1", S, 0, log, 4)
    history.replica("b2", S, 0, log, 4)
    return history


def test_a_clean_history_has_no_anomaly_and_reports_every_count() -> None:
    report = _clean().check()
    assert report.ok, str(report)
    assert list(report.counts) == list(ANOMALIES)
    assert str(report).startswith("0 lost-write, 0 unseen")


def test_lost_write() -> None:
    history = QueueHistory()
    history.send("p1", S, 0, b"a", OK, 0)
    history.send("p1", S, 0, b"b", OK, 1)
    history.poll("c1", S, 0, [(0, b"a")])
    history.seek("c1", S, 0)
    history.poll("c1", S, 0, [(2, b"c")])  # read past offset 1, whose value nobody ever saw
    history.send("p2", S, 0, b"c", OK, 2)
    _only(history.check(), "lost-write")


def test_unseen() -> None:
    history = QueueHistory()
    history.send("p1", S, 0, b"a", OK, 0)
    history.send("p1", S, 0, b"b", OK, 1)
    history.poll("c1", S, 0, [(0, b"a")])  # nobody read as far as offset 1
    _only(history.check(), "unseen")


def test_inconsistent_offsets() -> None:
    history = QueueHistory()
    history.send("p1", S, 0, b"a", OK, 0)
    history.poll("c1", S, 0, [(0, b"a")])
    history.replica("b2", S, 0, [(0, b"z")], 1)  # the same offset, another value, on one node
    report = history.check()
    assert report.counts["inconsistent-offsets"] == 1, str(report)


def test_duplicate() -> None:
    history = QueueHistory()
    history.send("p1", S, 0, b"a", OK, 0)
    history.poll("c1", S, 0, [(0, b"a"), (1, b"a")])  # a retried send stored twice
    _only(history.check(), "duplicate")


def test_nonmonotonic_send() -> None:
    history = QueueHistory()
    history.send("p1", S, 0, b"a", OK, 5)
    history.send("p1", S, 0, b"b", OK, 3)  # acknowledged later, at a lower offset
    history.poll("c1", S, 0, [(3, b"b")])
    history.seek("c1", S, 0)
    history.poll("c1", S, 0, [(5, b"a")])
    _only(history.check(), "nonmonotonic-send")


def test_nonmonotonic_poll() -> None:
    history = QueueHistory()
    history.send("p1", S, 0, b"a", OK, 0)
    history.send("p1", S, 0, b"b", OK, 1)
    history.poll("c1", S, 0, [(0, b"a"), (1, b"b")])
    history.poll("c1", S, 0, [(1, b"b")])  # delivered again, no seek in between
    _only(history.check(), "nonmonotonic-poll")


def test_a_seek_allows_polling_again() -> None:
    history = QueueHistory()
    history.send("p1", S, 0, b"a", OK, 0)
    history.poll("c1", S, 0, [(0, b"a")])
    history.seek("c1", S, 0)
    history.poll("c1", S, 0, [(0, b"a")])
    assert history.check().ok


def test_poll_skip() -> None:
    history = QueueHistory()
    for offset, value in enumerate([b"a", b"b", b"c"]):
        history.send("p1", S, 0, value, OK, offset)
    history.poll("c2", S, 0, [(0, b"a"), (1, b"b"), (2, b"c")])
    history.poll("c1", S, 0, [(0, b"a"), (2, b"c")])  # over offset 1, which holds b"b"
    _only(history.check(), "poll-skip")


def test_a_gap_with_no_value_is_no_skip() -> None:
    history = QueueHistory()
    history.send("p1", S, 0, b"a", OK, 0)
    history.send("p1", S, 0, b"c", OK, 2)  # offset 1: a control record or compacted away, no value anywhere
    history.poll("c1", S, 0, [(0, b"a"), (2, b"c")])
    assert history.check().ok


def test_lost_on_node() -> None:
    history = QueueHistory()
    history.send("p1", S, 0, b"a", OK, 0)
    history.send("p1", S, 0, b"b", OK, 1)
    history.poll("c1", S, 0, [(0, b"a"), (1, b"b")])
    history.replica("b1", S, 0, [(0, b"a"), (1, b"b")], 2)
    history.replica("b2", S, 0, [(0, b"a")], 1, in_isr=True)  # truncated on one node, still in the ISR
    history.replica("b3", S, 0, [(0, b"a")], 1, in_isr=False)  # out of the ISR and behind: allowed
    _only(history.check(), "lost-on-node")


def test_hw_regression() -> None:
    history = _clean()
    history.high_watermark("c1", S, 0, 3)  # after 4
    _only(history.check(), "hw-regression")
