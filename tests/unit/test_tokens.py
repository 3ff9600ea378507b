"""The holds a running message passes on: named so its worker's main process can name them."""

from __future__ import annotations

from celery_singleton_lock.tokens import (
    debounced_token,
    is_reservation_of,
    queued_form,
    queued_token,
    read_token,
    requeue_token,
    reserved_token,
    retry_shape,
    retry_token,
)


class TestPassedHolds:
    def test_the_worker_names_the_same_hold_as_the_run_that_passed_it(self) -> None:
        queued = queued_token("id-1")
        assert requeue_token("id-1", queued, 3) == requeue_token("id-1", queued, 3)
        assert retry_token("id-1", queued, 0) == retry_token("id-1", queued, 0)

    def test_each_send_and_each_message_has_its_own(self) -> None:
        queued, other = queued_token("id-1"), queued_token("id-1")
        names = {
            requeue_token("id-1", queued, 1),
            requeue_token("id-1", queued, 2),
            retry_token("id-1", queued, 0),
            retry_token("id-1", queued, 1),
            requeue_token("id-1", other, 1),
        }
        assert len(names) == 5

    def test_a_chain_of_sends_keeps_the_first_messages_nonce(self) -> None:
        queued = queued_token("id-1")
        first = requeue_token("id-1", queued, 1)
        assert requeue_token("id-1", first, 2) == requeue_token("id-1", queued, 2)
        assert retry_token("id-1", first, 0) == retry_token("id-1", queued, 0)

    def test_it_reads_as_a_queued_hold_of_its_task_with_its_age(self) -> None:
        queued = queued_token("id-1")
        for passed in (requeue_token("id-1", queued, 4), retry_token("id-1", queued, 2)):
            holder = read_token(passed)
            assert holder.state == "queued"
            assert holder.task_id == "id-1"
            assert holder.since == read_token(queued).since

    def test_a_worker_reserves_it_and_the_run_names_that_reservation(self) -> None:
        passed = requeue_token("id-1", queued_token("id-1"), 1)
        reservation = reserved_token("id-1", "w1@host", passed)
        assert is_reservation_of(reservation, "id-1", passed)
        assert queued_form(reservation) == passed

    def test_a_debounced_burst_is_not_carried_on(self) -> None:
        debounced = debounced_token("id-1", 1_700_000_000.0)
        passed = requeue_token("id-1", debounced, 1)
        assert "~" not in passed
        assert read_token(passed).task_id == "id-1"

    def test_without_a_queued_hold_each_is_fresh(self) -> None:
        assert requeue_token("id-1", None, 1) != requeue_token("id-1", None, 1)
        assert retry_token("id-1", "not a token", 0).startswith("q|")

    def test_the_worker_finds_a_fresh_retry_hold_by_its_step_and_task(self) -> None:
        # while_executing and limit: the message has no queued hold to name it from.
        for queued in (None, "not a token"):
            passed = retry_token("id-1", queued, 1)
            prefix, suffix = retry_shape("id-1", queued, 1)
            assert passed.startswith(prefix)
            assert passed.endswith(suffix)
            assert read_token(passed).task_id == "id-1"
            assert read_token(passed).since is not None
            # Not the hold of another attempt, another task id or a running lease.
            for other in (retry_token("id-1", queued, 0), retry_token("id-12", queued, 1)):
                assert not other.endswith(suffix)
            assert prefix == "q|"

    def test_with_a_queued_hold_the_worker_names_the_retry_hold_exactly(self) -> None:
        queued = queued_token("id-1")
        assert retry_shape("id-1", queued, 2) == (retry_token("id-1", queued, 2), "")
