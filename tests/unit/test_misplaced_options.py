"""Options written out of place: an option that goes inside another (``keep_failures=``
outside ``idempotency={...}``) and typos of ours are refused where they are written,
saying what to write; Celery's own task options pass untouched."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_singleton_lock import ConfigurationError, SingletonTask, singleton_task
from celery_singleton_lock.config.options import NESTED_OPTIONS

Make = Callable[[dict[str, Any]], Callable[[Callable[..., object]], object]]


@pytest.fixture(name="app")
def fixture_app() -> Iterator[Celery]:
    """An app that never connects: a task is made and checked without a broker."""
    app = Celery("misplaced", set_as_current=False)
    app.conf.update(broker_url="memory://", singleton_lock_url="memory://")
    yield app
    app.close()


def job(request_id: str, payload: dict[str, Any] | None = None) -> None: ...


def unique() -> str:
    return f"misplaced.{uuid.uuid4().hex}"


def decorator(app: Celery) -> Make:
    return lambda options: singleton_task(app=app, name=unique(), shared=False, **options)


def base_class(app: Celery) -> Make:
    """@app.task(base=SingletonTask, ...): the names become class attributes."""
    return lambda options: app.task(
        base=SingletonTask, name=unique(), lazy=False, shared=False, **options
    )


def singleton_dict(app: Celery) -> Make:
    return lambda options: app.task(
        base=SingletonTask, name=unique(), lazy=False, shared=False, singleton=options
    )


# A value for each option that goes inside another (every one has an entry: a new nested
# option must be added here, so it is tested too).
NESTED_VALUES: dict[str, object] = {
    "keep_failures": True,
    "key_from": "request_id",
    "window": 3600,
}


def test_every_nested_option_has_a_value_here() -> None:
    assert set(NESTED_VALUES) == set(NESTED_OPTIONS)


class TestNestedOptionsAtTheTop:
    @pytest.mark.parametrize("option", sorted(NESTED_VALUES))
    def test_a_decorator_keyword_is_refused_naming_where_it_goes(
        self, app: Celery, option: str
    ) -> None:
        value = NESTED_VALUES[option]
        with pytest.raises(ConfigurationError) as caught:
            decorator(app)({option: value})(job)
        parent = NESTED_OPTIONS[option]
        assert (
            f"{option} is an option of {parent}=...: write "
            f"@singleton_task({parent}={{{option!r}: {value!r}}})"
        ) in str(caught.value)

    @pytest.mark.parametrize("form", [base_class, singleton_dict])
    @pytest.mark.parametrize("option", sorted(NESTED_VALUES))
    def test_a_class_attribute_or_singleton_entry_is_refused_naming_where_it_goes(
        self, app: Celery, form: Callable[[Celery], Make], option: str
    ) -> None:
        value = NESTED_VALUES[option]
        with pytest.raises(ConfigurationError) as caught:
            form(app)({option: value})(job)
        parent = NESTED_OPTIONS[option]
        assert (
            f"{option} is an option of {parent}=...: write "
            f"singleton={{{parent!r}: {{{option!r}: {value!r}}}}}"
        ) in str(caught.value)

    def test_a_class_based_task_is_refused_too(self) -> None:
        with pytest.raises(ConfigurationError, match="keep_failures is an option of idempotency"):

            class Charge(SingletonTask):
                name = unique()
                keep_failures = True

                def run(self, request_id: str) -> None: ...

    def test_the_same_option_in_its_place_is_taken(self, app: Celery) -> None:
        task = decorator(app)({"idempotency": dict(NESTED_VALUES)})(job)
        options = task.singleton_options().idempotency
        assert (options.keep_failures, options.key_from, options.window) == (
            True,
            "request_id",
            3600,
        )

    def test_a_typo_of_a_nested_option_suggests_it_and_where_it_goes(self, app: Celery) -> None:
        with pytest.raises(ConfigurationError) as caught:
            decorator(app)({"keep_failure": True})(job)
        assert (
            "keep_failure= is not an option; did you mean keep_failures? keep_failures is an "
            "option of idempotency=...: write @singleton_task(idempotency={'keep_failures': "
            "True})"
        ) in str(caught.value)

    def test_a_value_too_long_to_quote_is_shown_as_an_ellipsis(self, app: Celery) -> None:
        with pytest.raises(ConfigurationError) as caught:
            decorator(app)({"window": list(range(100))})(job)
        assert "write @singleton_task(idempotency={'window': ...})" in str(caught.value)

    def test_a_timedelta_is_quoted_as_written(self, app: Celery) -> None:
        with pytest.raises(ConfigurationError) as caught:
            decorator(app)({"window": timedelta(hours=1)})(job)
        assert "{'window': datetime.timedelta(seconds=3600)}" in str(caught.value)


class TestTyposOfOurOptions:
    @pytest.mark.parametrize(
        ("typo", "meant"),
        [
            ("on_duplicates", "on_duplicate"),
            ("max_pendng", "max_pending"),
            ("ttl_s", "ttl"),
            ("queue_tl", "queue_ttl"),
            ("on_contentions", "on_contention"),
            ("throtle", "throttle"),
            ("total_limits", "total_limit"),
        ],
    )
    @pytest.mark.parametrize("form", [decorator, base_class, singleton_dict])
    def test_a_typo_is_refused_suggesting_the_right_name(
        self, app: Celery, form: Callable[[Celery], Make], typo: str, meant: str
    ) -> None:
        with pytest.raises(ConfigurationError, match=f"did you mean {meant}=\\?"):
            form(app)({typo: 1})(job)


# Celery's own task options, each with a value it takes; none is ours, none is refused.
CELERY_OPTIONS: dict[str, object] = {
    "bind": False,
    "queue": "default",
    "max_retries": 3,
    "autoretry_for": (ValueError,),
    "dont_autoretry_for": (KeyError,),
    "retry_kwargs": {"countdown": 1},
    "retry_backoff": True,
    "retry_backoff_max": 60,
    "retry_jitter": False,
    "acks_late": True,
    "acks_on_failure_or_timeout": True,
    "reject_on_worker_lost": True,
    "rate_limit": "10/s",
    "time_limit": 30,
    "soft_time_limit": 20,
    "serializer": "json",
    "typing": False,
    "ignore_result": True,
    "store_errors_even_if_ignored": True,
    "track_started": True,
    "default_retry_delay": 5,
    "expires": 60,
    "priority": 5,
    "trail": False,
    "throws": (KeyError,),
    "routing_key": "default",
    "exchange": "default",
    "pydantic": False,
    "my_team": "billing",  # a custom attribute, which Celery keeps on the task
}


class TestCeleryOptions:
    # queue=, exchange= and routing_key= as task attributes are deprecated by Celery (it
    # says so when the task is bound): still its options, still passed on.
    @pytest.mark.filterwarnings("ignore::celery.exceptions.CDeprecationWarning")
    @pytest.mark.parametrize("form", [decorator, base_class])
    def test_celerys_own_options_pass_untouched(
        self, app: Celery, form: Callable[[Celery], Make]
    ) -> None:
        task = form(app)(dict(CELERY_OPTIONS))(job)
        # Celery keeps no attribute for bind= and pydantic=; the task stores STARTED
        # itself once it holds its lease, so track_started moves to its own attribute.
        kept = {n: v for n, v in CELERY_OPTIONS.items() if n not in ("bind", "pydantic")}
        kept["singleton_track_started"] = kept.pop("track_started")
        assert {name: getattr(task, name) for name in kept} == kept

    def test_a_base_class_with_attributes_of_its_own_passes(self, app: Celery) -> None:
        class Base(SingletonTask):
            team = "billing"
            windows = 3  # near a nested option's name (window), but an attribute of its own
            max_window = 10

        task = singleton_task(app=app, name=unique(), shared=False, base=Base)(job)
        assert isinstance(task, Base)
        assert (task.team, task.windows, task.max_window) == ("billing", 3, 10)
