"""Contention policies, tested with states built by hand (no Redis, no worker)."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest

from celery_singleton_lock import ConfigurationError
from celery_singleton_lock.policies import (
    ContentionState,
    Fail,
    Requeue,
    Skip,
    Wait,
    contention_policy,
    fail,
    longest_requeue,
    on_duplicate_option,
    requeue,
    skip,
    wait,
)


def state(attempt: int = 0, *, waited: bool = False) -> ContentionState:
    return ContentionState(
        task_name="t", name="p:{k}", attempt=attempt, holder="tok", retry_after=3, waited=waited
    )


class TestFail:
    def test_fails_naming_the_holder(self) -> None:
        decision = fail()(state())
        assert isinstance(decision, Fail)
        assert "tok" in decision.reason


class TestSkip:
    def test_skips_naming_the_holder(self) -> None:
        decision = skip()(state())
        assert isinstance(decision, Skip)
        assert "tok" in decision.reason

    def test_is_a_fallback_after_a_wait(self) -> None:
        policy = wait(timeout=2, then=skip())
        assert policy(state()) == Wait(2)
        assert isinstance(policy(state(waited=True)), Skip)
        assert isinstance(wait(timeout=2, then="skip")(state(waited=True)), Skip)


class TestRequeue:
    def test_backs_off_exponentially_up_to_the_cap(self) -> None:
        policy = requeue(max_tries=10, backoff=1, cap=8, rng=lambda: 1.0)
        countdowns = [policy(state(n)) for n in range(6)]
        assert countdowns == [
            Requeue(1),
            Requeue(2),
            Requeue(4),
            Requeue(8),
            Requeue(8),
            Requeue(8),
        ]

    def test_never_requeues_faster_than_the_floor(self) -> None:
        assert requeue(rng=lambda: 0.0, floor=0.2)(state()) == Requeue(0.2)

    def test_fails_after_max_tries(self) -> None:
        decision = requeue(max_tries=3)(state(3))
        assert isinstance(decision, Fail)
        assert "gave up after 3 requeues" in decision.reason

    @pytest.mark.parametrize(
        "options",
        [{"max_tries": -1}, {"max_tries": 1.5}, {"max_tries": True}, {"backoff": -1}, {"cap": "x"}],
    )
    def test_bad_options_are_refused(self, options: dict[str, object]) -> None:
        with pytest.raises(ConfigurationError, match="requeue"):
            requeue(**options)  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        "policy",
        [
            requeue(),
            requeue(max_tries=2, backoff=0.05, cap=0.2),
            requeue(max_tries=3, backoff=10, cap=7200),
            requeue(max_tries=1, backoff=0, floor=0.3),
        ],
    )
    def test_the_longest_countdown_is_the_longest_any_try_gets(self, policy: requeue) -> None:
        longest = replace(policy, rng=lambda: 1.0)
        tries = [longest(state(n)) for n in range(policy.max_tries)]
        assert longest_requeue(policy) == max(t.countdown for t in tries if isinstance(t, Requeue))

    def test_a_policy_that_never_requeues_has_no_longest_countdown(self) -> None:
        assert longest_requeue(requeue(max_tries=0)) is None
        assert longest_requeue(fail()) is None
        assert longest_requeue(wait(then=skip())) is None
        assert longest_requeue(lambda s: Requeue(99)) is None  # the user's own: unknown
        assert longest_requeue(wait(then=requeue(cap=5))) == 5


class TestWait:
    def test_waits_first_then_hands_over(self) -> None:
        policy = wait(timeout=2, then=fail())
        assert policy(state()) == Wait(2.0)
        assert isinstance(policy(state(waited=True)), Fail)

    def test_default_fallback_is_requeue(self) -> None:
        assert isinstance(wait()(state(waited=True)), Requeue)

    def test_bad_timeout_and_fallback_are_refused(self) -> None:
        with pytest.raises(ConfigurationError, match="positive"):
            wait(timeout=0)
        with pytest.raises(ConfigurationError, match="not a policy"):
            wait(then="retry")  # type: ignore[arg-type]


class TestOptions:
    @pytest.mark.parametrize(
        ("name", "kind"), [("fail", fail), ("skip", skip), ("requeue", requeue), ("wait", wait)]
    )
    def test_strings_are_shortcuts_for_the_defaults(self, name: str, kind: type) -> None:
        assert contention_policy(name) == kind()

    def test_unknown_contention_lists_what_is_allowed(self) -> None:
        with pytest.raises(ConfigurationError) as caught:
            contention_policy("retry")
        assert "['fail', 'requeue', 'skip', 'wait']" in str(caught.value)

    def test_on_duplicate_values(self) -> None:
        assert on_duplicate_option("raise") == "raise"
        with pytest.raises(ConfigurationError, match=r"\['return', 'raise', 'replace', 'cancel'\]"):
            on_duplicate_option("ignore")

    def test_policies_pickle(self) -> None:
        policy = wait(timeout=3, then=requeue(max_tries=2))
        assert pickle.loads(pickle.dumps(policy)).timeout == 3


class TestContentionStateNames:
    def test_the_lock_is_named_name(self) -> None:
        assert state().name == "p:{k}"

    def test_key_of_0_1_still_builds_and_reads_with_a_warning(self) -> None:
        with pytest.warns(DeprecationWarning, match="ContentionState.name"):
            old = ContentionState(task_name="t", key="p:1", attempt=0)
        assert old.name == "p:1"
        with pytest.warns(DeprecationWarning, match="ContentionState.name"):
            assert old.key == "p:1"

    def test_a_state_needs_a_lock_name(self) -> None:
        with pytest.raises(TypeError, match="name="):
            ContentionState(task_name="t")
