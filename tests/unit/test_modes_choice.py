"""The choice of mode is a table (``modes.choosing.Choice``, one ``CHOICE`` per mode module):
every set of options that passes its checks picks one mode, and the options a mode reads,
the lock scopes and the locks page's roles come from the modes themselves."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import pytest

from celery_singleton_lock import ConfigurationError
from celery_singleton_lock.config.options import LOCK_SCOPES, OPTION_NAMES, SingletonOptions
from celery_singleton_lock.modes import CHOICES, shown_state


def job(order_id: int) -> None: ...


@dataclass(frozen=True)
class Row:
    """A holder as the locks page lists it (``modes.refusal.HolderRow``)."""

    task_id: str | None
    state: str
    ttl: float | None = 30.0


# Values of the options that pick a mode, None for not given.
AXES: dict[str, list[object]] = {
    "lock": [None, *LOCK_SCOPES],
    "on_duplicate": [None, "return", "raise", "replace", "cancel"],
    "throttle": [None, 5],
    "debounce": [None, 5],
    "limit": [None, 1, 2],
    "total_limit": [None, 3],
    "rate": [None, "10/m"],
    "dedupe": [None, False],
}


def _combinations() -> list[dict[str, object]]:
    combos = []
    for values in itertools.product(*AXES.values()):
        combos.append({k: v for k, v in zip(AXES, values, strict=True) if v is not None})
    return combos


class TestTheChoice:
    def test_every_mode_module_declares_its_choice(self) -> None:
        names = [choice.name for choice in CHOICES]
        assert len(names) == len(set(names))
        assert set(names) >= {
            "until_executed",
            "until_executing",
            "while_executing",
            "replace",
            "cancel",
            "debounce",
            "throttle",
            "limit",
        }

    def test_options_that_pass_their_checks_pick_one_mode(self) -> None:
        picked = set()
        for raw in _combinations():
            try:
                options = SingletonOptions.build("t", job, raw)
            except ConfigurationError:
                continue
            picked.add(options.mode.name)  # two choices that tie raise LookupError
        assert picked >= {choice.name for choice in CHOICES}  # each is picked by some options

    @pytest.mark.parametrize(
        ("raw", "mode"),
        [
            ({}, "until_executed"),
            ({"lock": "until_executing"}, "until_executing"),
            ({"dedupe": False}, "while_executing"),
            ({"limit": 1}, "while_executing"),
            ({"limit": 1, "total_limit": 2}, "limit"),
            ({"on_duplicate": "replace"}, "replace"),
            ({"on_duplicate": "replace", "lock": "until_executing"}, "replace"),
            ({"on_duplicate": "cancel"}, "cancel"),
            ({"debounce": 5}, "debounce"),
            ({"throttle": 5, "on_duplicate": "raise"}, "throttle"),
        ],
    )
    def test_the_options_pick(self, raw: dict[str, object], mode: str) -> None:
        assert SingletonOptions.build("t", job, raw).mode.name == mode

    def test_a_mode_s_own_options_and_its_scope_come_from_its_module(self) -> None:
        for choice in CHOICES:
            assert set(choice.reads) <= set(OPTION_NAMES), choice.mode.name
            if choice.scope is not None:
                assert choice.scope in LOCK_SCOPES
        assert {"until_executed", "until_executing", "while_executing"} <= set(LOCK_SCOPES)

    def test_what_a_mode_settles_is_what_its_options_come_to(self) -> None:
        debounced = SingletonOptions.build("t", job, {"debounce": 5})
        assert (debounced.lock, debounced.on_duplicate) == ("until_executing", "replace")
        cancelling = SingletonOptions.build("t", job, {"on_duplicate": "cancel"})
        assert cancelling.lock == "until_executing"

    def test_the_locks_page_asks_the_modes_that_write_beside_a_key(self) -> None:
        assert shown_state("pending", "running") == "reserved"
        assert shown_state("throttle", "queued") == "throttled"
        assert shown_state(None, "running") == "running"


def result_of(task_id: str) -> Any:
    """Stands for ``task.AsyncResult``: what the refusal returns when it returns one."""
    return f"result of {task_id}"


class TestTheRefusal:
    """Raise or return is the refusal a mode is built with (``Chosen.as_duplicate``)."""

    @pytest.mark.parametrize(
        ("raw", "raises"),
        [
            ({}, False),
            ({"on_duplicate": "return"}, False),
            ({"on_duplicate": "raise"}, True),
            ({"lock": "until_executing", "on_duplicate": "raise"}, True),
            ({"lock": "until_executing"}, False),
            ({"throttle": 5, "on_duplicate": "raise"}, True),
            ({"throttle": 5}, False),
            ({"on_duplicate": "replace"}, False),  # refused by a running holder: its result
            ({"on_duplicate": "cancel"}, False),
        ],
    )
    def test_a_duplicate_is_answered_as_on_duplicate_says(
        self, raw: dict[str, object], raises: bool
    ) -> None:
        refusal = SingletonOptions.build("t", job, raw).mode.refusal
        answer = refusal.duplicate("holder-1", result_of)
        assert answer == (None if raises else "result of holder-1")
        # A holder that cannot be told: raised whatever the option says.
        assert refusal.duplicate(None, result_of) is None
        said = "raises DuplicateTaskError" if raises else "returns it"
        assert refusal.answers_duplicate == said

    @pytest.mark.parametrize(
        ("raw", "said"),
        [
            ({}, "refused: a duplicate of h1 (queued); returns it"),
            (
                {"on_duplicate": "raise"},
                "refused: a duplicate of h1 (queued); raises DuplicateTaskError",
            ),
            (
                {"lock": "until_executing", "on_duplicate": "raise"},
                "refused: a duplicate of h1 (queued); raises DuplicateTaskError",
            ),
        ],
    )
    def test_the_locks_page_says_what_the_refusal_answers(
        self, raw: dict[str, object], said: str
    ) -> None:
        mode = SingletonOptions.build("t", job, raw).mode
        held = {mode.hold_role: Row("h1", "queued")}
        assert mode.new_call(held) == said
