"""``@singleton_task`` and ``@app.task(base=SingletonTask)``: one declaration, checked at once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from celery import Celery
from celery.local import PromiseProxy

from celery_singleton_lock import ConfigurationError, SingletonTask, singleton_task


@pytest.fixture(name="app")
def fixture_app() -> Iterator[Celery]:
    """An app that never connects and is not finalized: a task is made without a broker."""
    app = Celery("decorated", set_as_current=False)
    app.conf.update(broker_url="memory://", singleton_lock_url="memory://")
    yield app
    app.close()


def job(order_id: int) -> int:
    return order_id


def unique() -> str:
    return f"decorated.{uuid.uuid4().hex}"


class TestLazy:
    """``lazy=`` as ``@app.task`` takes it: the task is made when the app is finalized (or
    the task first used) rather than at once; its options are checked at once either way."""

    def test_a_lazy_task_is_made_when_the_app_is_finalized(self, app: Celery) -> None:
        name = unique()
        task = singleton_task(app=app, name=name, shared=False, lazy=True, key=["order_id"])(job)
        assert type(task) is PromiseProxy
        assert not task.__evaluated__()
        app.finalize()
        assert task.__evaluated__()
        assert isinstance(task, SingletonTask)
        assert app.tasks[name] is task.__maybe_evaluate__()
        assert task.singleton_options().key.name == name

    def test_a_lazy_tasks_bad_options_are_refused_at_decoration(self, app: Celery) -> None:
        with pytest.raises(ConfigurationError, match=r"did you mean on_duplicate=\?"):
            singleton_task(app=app, name=unique(), shared=False, lazy=True, on_duplicates=1)(job)
        with pytest.raises(ConfigurationError, match="throttle must be positive"):
            singleton_task(app=app, name=unique(), shared=False, lazy=True, throttle=0)(job)

    def test_lazy_on_a_finalized_app_makes_the_task_at_once(self, app: Celery) -> None:
        app.finalize()
        task = singleton_task(app=app, name=unique(), shared=False, lazy=True)(job)
        assert isinstance(task, SingletonTask)
        assert type(task) is not PromiseProxy

    @pytest.mark.parametrize("options", [{}, {"lazy": False}])
    def test_otherwise_the_task_is_made_at_once(
        self, app: Celery, options: dict[str, object]
    ) -> None:
        task = singleton_task(app=app, name=unique(), shared=False, **options)(job)
        assert type(task) is not PromiseProxy
        assert issubclass(type(task), SingletonTask)


class TestOneDeclaration:
    """The decorator declares through the base class's one path; each form's message
    says what to write in that form."""

    def test_the_decorator_and_the_base_class_build_the_same_options(self, app: Celery) -> None:
        options = {"key": ["order_id"], "on_duplicate": "raise", "ttl": 60}
        decorated = singleton_task(app=app, name=unique(), shared=False, **options)(job)
        based = app.task(
            base=SingletonTask, name=unique(), lazy=False, shared=False, singleton=options
        )(job)
        one, other = decorated.singleton_options(), based.singleton_options()
        assert (one.lock, one.on_duplicate, one.ttl) == (other.lock, other.on_duplicate, 60)
        assert one.key.name == decorated.name

    def test_an_incumbents_option_says_what_to_write_in_each_form(self, app: Celery) -> None:
        with pytest.raises(ConfigurationError, match=r"write @singleton_task\(idempotency="):
            singleton_task(app=app, name=unique(), shared=False, window=60)(job)
        with pytest.raises(ConfigurationError, match=r"write singleton=\{'idempotency'"):
            app.task(base=SingletonTask, name=unique(), lazy=False, shared=False, window=60)(job)

    def test_a_subclass_as_base_declares_through_its_own_path(self, app: Celery) -> None:
        declared: list[str] = []

        class Audited(SingletonTask):
            @classmethod
            def declare_singleton(cls, name: str, *args: object, **kwargs: object) -> object:
                declared.append(name)
                return super().declare_singleton(name, *args, **kwargs)

        declared.clear()  # Audited declared itself as it was made: a class-based task
        name = unique()
        singleton_task(app=app, name=name, base=Audited, shared=False)(job)
        assert declared == [name, name]  # at decoration, then as Celery makes the class
