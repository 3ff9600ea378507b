"""When a Redlock's read over its masters is settled: one value on a majority, or none can be."""

from __future__ import annotations

from celery_singleton_lock.lease.redlock.quorum import Answers, NoAnswer, Quorum

PENDING = NoAnswer("not yet")


def test_a_read_is_settled_by_a_value_on_a_majority_not_by_the_first_majority_heard() -> None:
    quorum = Quorum(5)
    # Three masters heard, one of them before a take landed there: not settled yet.
    early = Answers(["t1", None, "t1", PENDING, PENDING])
    assert quorum.heard(early)
    assert not quorum.agreed(early)
    assert quorum.agreed(Answers(["t1", None, "t1", "t1", PENDING]))
    # No holder on a majority is an answer too.
    assert quorum.agreed(Answers([None, None, None, PENDING, PENDING]))


def test_a_read_no_value_can_win_any_more_is_settled() -> None:
    quorum = Quorum(5)
    split = Answers(["t1", "t2", None, "t3", PENDING])
    assert quorum.agreed(split)  # at most 2 for any token with one master to go
    assert not quorum.agreed(Answers(["t1", "t2", PENDING, PENDING, PENDING]))
