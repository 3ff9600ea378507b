"""A lock's history where none is kept: eager tasks on ``memory://`` run with ``history=True``
as without (nothing is written, nothing fails), and bad settings are refused by name."""

from __future__ import annotations

import uuid

import pytest
from celery import Celery

from celery_singleton_lock import ConfigurationError, singleton_task
from celery_singleton_lock.config.settings import SingletonConfig
from celery_singleton_lock.contrib.lock_history import entries_of


def test_an_eager_task_keeping_a_history_on_the_memory_store_runs_as_ever() -> None:
    app = Celery("history-units", set_as_current=False)
    app.conf.update(singleton_lock_url="memory://", task_always_eager=True,
                    singleton_lock_history=True)  # fmt: skip

    @singleton_task(app=app, key=["item"], name=f"history-units.{uuid.uuid4().hex}", shared=False)
    def sync(item: str) -> str:
        return item

    try:
        assert sync.delay("a").get() == "a"
        assert sync.delay("a").get() == "a"
        store = sync.singleton_context.store
        assert entries_of(store, sync.singleton_options().key.derive(("a",), {})) == (
            sync.singleton_options().key.derive(("a",), {}), [],
        )  # fmt: skip
    finally:
        app.close()


@pytest.mark.parametrize(
    ("setting", "value", "says"),
    [
        ("singleton_lock_history", "yes", "singleton_lock_history='yes': use True or False"),
        ("singleton_lock_history_length", 0, "the entries each lock keeps, 1 to 100000"),
        ("singleton_lock_history_ttl", -1, "singleton_lock_history_ttl"),
    ],
)
def test_a_bad_history_setting_is_refused_by_name(setting: str, value: object, says: str) -> None:
    app = Celery("history-settings", set_as_current=False)
    app.conf.update(singleton_lock_url="memory://", **{setting: value})
    with pytest.raises(ConfigurationError, match=says.replace("(", r"\(").replace(")", r"\)")):
        SingletonConfig.from_conf(app.conf)


def test_the_task_option_must_be_a_flag() -> None:
    app = Celery("history-option", set_as_current=False)
    with pytest.raises(ConfigurationError, match="history='on': use True or False"):
        singleton_task(app=app, history="on", name=f"h.{uuid.uuid4().hex}", shared=False)(
            lambda item: item
        )
