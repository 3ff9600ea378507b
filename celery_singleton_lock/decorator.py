"""``@singleton_task``: a Celery task with a singleton lock, bare or with options."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, overload

from celery import shared_task

from .config.options import OPTION_NAMES
from .exceptions import ConfigurationError
from .task import SingletonTask

if TYPE_CHECKING:
    from celery import Celery


@overload
def singleton_task(func: Callable[..., object], /) -> SingletonTask: ...


@overload
def singleton_task(
    func: None = None, /, *, app: Celery | None = None, **options: object
) -> Callable[[Callable[..., object]], SingletonTask]: ...


def singleton_task(
    func: Callable[..., object] | None = None, /, *, app: Celery | None = None, **options: object
) -> SingletonTask | Callable[[Callable[..., object]], SingletonTask]:
    """Declare a singleton task: ``@singleton_task`` or ``@singleton_task(key=[...], ...)``.

    Singleton options: ``key``, ``lock``, ``throttle``, ``debounce``, ``max_wait``,
    ``limit``, ``on_duplicate``, ``on_contention``, ``ttl``, ``queue_ttl``, ``dedupe``,
    ``idempotency``, ... (``OPTION_NAMES``). Every other keyword is an ordinary Celery task
    option (``bind``, ``acks_late``, ``max_retries``, ...), but for the incumbents'
    options, typos of ours and options that go inside another (``keep_failures`` in
    ``idempotency={...}``): those are refused, saying what to write. Binds to ``app`` when
    given, else to every app like ``shared_task``. Options are validated here, at decoration.
    With ``app``, the task is made at once; ``lazy=True`` makes it as ``app.task`` does,
    when the app is finalized or the task first used. The task dispatches as a Celery
    task does (``delay``, ``apply_async``, signatures), and a batch in one go with
    ``apply_many(items)`` (its holds in one lock-store script call).
    """
    if func is not None and not callable(func):
        raise ConfigurationError(
            f"singleton_task got {func!r} as its first argument; write @singleton_task or "
            "@singleton_task(key=[...]) with keyword options"
        )
    if "singleton" in options:
        raise ConfigurationError(
            "pass singleton options as keywords of @singleton_task (key=..., ttl=...), "
            "not as singleton={...}; that dict is for @app.task(base=SingletonTask, ...)"
        )
    base = options.pop("base", SingletonTask)
    if not (inspect.isclass(base) and issubclass(base, SingletonTask)):
        raise ConfigurationError(f"base={base!r} must be SingletonTask or a subclass of it")
    singleton = {name: options.pop(name) for name in OPTION_NAMES if name in options}

    def decorate(fun: Callable[..., object]) -> SingletonTask:
        if not (inspect.isfunction(fun) or inspect.ismethod(fun)):
            raise ConfigurationError(
                f"singleton_task decorates a function (def ...), got {fun!r}; write "
                "@singleton_task(key=[...]) above a def (a class-based task subclasses "
                "SingletonTask)"
            )
        if inspect.iscoroutinefunction(fun):
            raise ConfigurationError(f"{fun.__qualname__}: Celery tasks cannot be async def")
        # Declared now, not when Celery makes the class (at finalization, for a shared
        # or lazy task): Celery registers a shared task for every app finalized later,
        # and a task that failed here must not fail there again; and `celery inspect
        # singleton_stats` checks command names before that. The class declares itself
        # again as it is made, under the name Celery gives it.
        name = str(options.get("name") or f"{fun.__module__}.{fun.__name__}")
        run = fun if options.get("bind") else staticmethod(fun)
        base.declare_singleton(name, options, run, singleton, decorator=True)
        task_options = {"base": base, "singleton": singleton, **options}
        # Celery makes the task class (a subclass of ``base``) and its instance: at once
        # unless lazy=True asks for its promise, as @app.task(lazy=True) gives.
        if app is not None:
            made = app.task(**{"lazy": False, **task_options})
        else:
            made = shared_task(**task_options)
        task: SingletonTask = made(fun)
        return task

    return decorate(func) if func is not None else decorate
