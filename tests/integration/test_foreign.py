"""Options ported from celery-once / celery-singleton, typos, and braceless keys: refused
where they are written, with what to write instead, before anything is published."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_singleton_lock import ConfigurationError, SingletonTask, singleton_task

from ..conftest import CeleryEnv
from ..support.runs import wait_for
from ..support.workers import Worker


@pytest.fixture(name="app")
def fixture_app(celery_env: CeleryEnv) -> Iterator[Celery]:
    """An app on the tests' real Redis broker, so 'nothing queued' is looked at there."""
    app = Celery("foreign", set_as_current=False)
    app.conf.update(
        broker_url=celery_env.broker.url,
        result_backend=celery_env.broker.url,
        singleton_lock_url=celery_env.lock.url,
    )
    yield app
    app.close()


def job(table_id: int, mode: str = "full") -> None: ...


# option -> what the message must name as its replacement
TASK_OPTIONS: list[tuple[dict[str, Any], str]] = [
    ({"unique_on": ["table_id"]}, "key=[...]"),
    ({"once": {"keys": ["table_id"], "graceful": True}}, "on_duplicate='return' for graceful=True"),
    ({"once": {"unlock_before_run": True}}, "lock='until_executing' for unlock_before_run"),
    ({"raise_on_duplicate": True}, "on_duplicate='raise'"),
    ({"lock_expiry": 60}, "throttle=<seconds>"),
    ({"dedup": False}, "did you mean dedupe=?"),
    ({"keys": ["table_id"]}, "did you mean key=?"),
    ({"on_contentions": "fail"}, "did you mean on_contention=?"),
    ({"on_duplicates": "raise"}, "did you mean on_duplicate=?"),
    ({"queue_tl": 60}, "did you mean queue_ttl=?"),
]


class TestTaskOptions:
    @pytest.mark.parametrize("form", ["decorator", "base class", "singleton dict"])
    @pytest.mark.parametrize(("options", "instead"), TASK_OPTIONS)
    def test_refused_when_the_task_is_made_naming_the_replacement(
        self, app: Celery, form: str, options: dict[str, Any], instead: str
    ) -> None:
        """@singleton_task(...), @app.task(base=SingletonTask, ...) with the option as a
        Celery keyword, and with it inside singleton={...}."""
        make = {
            "decorator": lambda: singleton_task(app=app, name="foreign.made", **options),
            "base class": lambda: app.task(
                base=SingletonTask, name="foreign.made", lazy=False, shared=False, **options
            ),
            "singleton dict": lambda: app.task(
                base=SingletonTask, name="foreign.made", lazy=False, shared=False,
                singleton=options,
            ),
        }[form]  # fmt: skip
        with pytest.raises(ConfigurationError) as caught:
            make()(job)
        assert instead in str(caught.value)

    def test_our_options_outside_the_singleton_dict_are_refused(self, app: Celery) -> None:
        with pytest.raises(ConfigurationError, match=r"key= belongs in singleton=\{'key': ...\}"):
            app.task(
                base=SingletonTask,
                name="foreign.misplaced",
                lazy=False,
                shared=False,
                key=["table_id"],
            )(job)

    def test_celery_options_and_custom_attributes_still_pass(self, app: Celery) -> None:
        task = singleton_task(
            app=app, name="foreign.fine", acks_late=True, max_retries=3, my_team="billing"
        )(job)
        assert task.acks_late is True
        assert task.my_team == "billing"

    def test_a_singleton_that_is_not_a_dict_is_refused(self, app: Celery) -> None:
        with pytest.raises(ConfigurationError, match="must be a dict of options"):
            app.task(
                base=SingletonTask, name="foreign.list", lazy=False, shared=False, singleton=["key"]
            )(job)


class TestBracelessKey:
    def test_a_key_naming_a_parameter_without_braces_is_refused(self, app: Celery) -> None:
        with pytest.raises(ConfigurationError) as caught:
            singleton_task(app=app, name="foreign.braceless", key="table_id")(job)
        message = str(caught.value)
        assert "did you mean key=['table_id'] or key='table:{table_id}'?" in message
        assert "one constant lock name" in message

    def test_a_constant_lock_name_on_purpose_stays_possible(self, app: Celery) -> None:
        one = singleton_task(app=app, name="foreign.nightly", key="nightly-sync")(job)
        callable_key = singleton_task(app=app, name="foreign.constant", key=lambda **_: "table_id")(
            job
        )
        assert one.singleton_options().key.derive((1,)) == "nightly-sync"
        assert one.singleton_options().key.derive((2,)) == "nightly-sync"
        assert callable_key.singleton_options().key.derive((3,)) == "table_id"

    @pytest.mark.parametrize("key", ["t:{table_id.real}", "t:{table_id[0]}", "t:{mode:{table_id}}"])
    def test_attribute_access_indexing_and_nested_fields_are_refused_at_decoration(
        self, app: Celery, key: str
    ) -> None:
        with pytest.raises(ConfigurationError, match="Use a callable"):
            singleton_task(app=app, name="foreign.nested", key=key)(job)


class TestPerCall:
    @pytest.fixture(name="task")
    def fixture_task(self, app: Celery) -> Any:
        return singleton_task(app=app, name="foreign.call")(job)

    @pytest.mark.parametrize(
        ("options", "instead"),
        [
            ({"once": {"graceful": True}}, "on the task"),
            ({"unique_on": ["table_id"]}, "key=[...]"),
            ({"singleton": {"key": ["table_id"]}}, "singleton= on the task"),
            ({"key": "x"}, "key= on the task"),
            ({"ttl": 5}, "ttl= on the task"),
            ({"deduplicate": False}, "dedupe=False"),
            ({"dedupe": 0}, "dedupe is True (the default) or False"),
            ({"dedupe": "false"}, "dedupe is True (the default) or False"),
            ({"dedupe": "no"}, "dedupe is True (the default) or False"),
        ],
    )
    def test_refused_before_anything_is_published(
        self, task: Any, celery_env: CeleryEnv, options: dict[str, Any], instead: str
    ) -> None:
        queue = "foreign-per-call"
        broker = celery_env.broker.client()
        broker.delete(queue)
        keys = set(celery_env.lock.client().keys("*"))
        with pytest.raises(ConfigurationError) as caught:
            task.apply_async((1,), queue=queue, **options)
        assert instead in str(caught.value)
        assert broker.llen(queue) == 0
        assert set(celery_env.lock.client().keys("*")) == keys


@pytest.mark.slow
def test_a_worker_warns_once_for_each_incumbent_setting(celery_env: CeleryEnv) -> None:
    worker = Worker(celery_env.env, extra_env={"CSL_FOREIGN_SETTINGS": "1"}).start()
    try:
        log = wait_for(
            lambda: "singleton_key_prefix is a setting" in worker.output() and worker.output(),
            what="the warning",
        )
    finally:
        worker.stop()
    for setting, instead in [
        ("ONCE", "use singleton_lock_url"),
        ("singleton_key_prefix", "use singleton_lock_prefix"),
        ("singleton_raise_on_duplicate", "use the task option on_duplicate='raise'"),
        ("singleton_backend_url", "use singleton_lock_url"),
        ("singleton_lock_expiry", "use singleton_lock_ttl (how long a dead worker's lease"),
    ]:
        assert log.count(f"{setting} is a setting of another library") == 1
        assert instead in log.split(f"{setting} is a setting", 1)[1].splitlines()[0]
    assert "hunter2" not in log
