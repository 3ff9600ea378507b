"""``SingletonTask``: the Celery lifecycle of a singleton task, at dispatch and at execution.

Dispatch takes a *queued hold* on the call's key and publishes; execution takes the *running
lease*, taking over the message's own hold in the same step. Tokens and headers are in
``tokens.py``; the gate around publish in ``publish/dispatch.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, ClassVar

from celery import Task

from . import broker
from . import signals as singleton_signals
from .broker import results
from .broker.in_transit import give_up_purged
from .broker.ride import lock_ride
from .broker.turn_sweep import kept_call
from .config.idempotency_options import warn_if_results_are_short
from .config.options import SingletonOptions, refuse_call_options, refuse_task_options
from .context import Delivery, TaskContext
from .contrib import events, metrics, tracing
from .exceptions import DuplicateTaskError
from .lease import Lease
from .publish import route
from .publish.call import Dispatch, TaskFacts
from .publish.idempotent import key_of_call, send_once
from .publish.many import Item, items_of, send_many
from .publish.retries import send_retry
from .publish.timing import refuse_as_celery
from .run import cancels, eta, in_turn, replays
from .run.answered import answer_of
from .run.execution import Execution, failed_run
from .tokens import (
    BYPASS_OPTION,
    TOKEN_HEADER,
    header,
    retry_token,
)
from .worker import hooks

if TYPE_CHECKING:
    from celery import Celery
    from celery.app.task import Context
    from celery.canvas import Signature
    from celery.result import AsyncResult
    from kombu.messaging import Producer


# Set on a request whose running lease a retry's message took over (publish/retries.py).
_HANDED_OVER = "singleton_handed_over"


class SingletonTask(Task):  # type: ignore[misc]
    """A Celery task that never runs concurrently with its duplicate, nor queues one.

    Options go in the ``singleton`` task option (``@app.task(base=SingletonTask,
    singleton={"key": ["order_id"]})``) or as keywords of ``@singleton_task``.

    Dispatch (``apply_async``, and so ``delay``, signatures and canvas): derive the key,
    take a *queued hold* on it in one round trip and publish with the key and the hold's
    token in the message headers; a duplicate gets ``on_duplicate``. Execution (the worker,
    or eagerly): take the *running lease* for the key the sender computed, taking over the
    message's own hold in the same step, renew it while the body runs, expose it as
    ``self.lease``, and release it however the body ends. A message that arrives without a
    hold of its own (``send_task``, beat, a redelivery) meets ``on_contention``.
    """

    singleton: ClassVar[Mapping[str, object] | None] = None
    Request = "celery_singleton_lock.worker.request:SingletonRequest"
    # A duplicate that did not run (on_contention="fail") is an expected outcome: Celery
    # logs it at INFO without a traceback, not as an ERROR.
    throws = (DuplicateTaskError,)
    _singleton_options: ClassVar[SingletonOptions | None] = None
    # Whether STARTED is stored (track_started): by the task once it holds its lease,
    # not by Celery's tracer before the task is called (see on_bound).
    singleton_track_started: ClassVar[bool] = False
    # What every dispatch reads, per task instance (``_dispatch_facts``).
    _facts: TaskFacts | None = None

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # Celery makes every keyword of @app.task(base=SingletonTask, ...) a class
        # attribute: an incumbent's option there would otherwise do nothing, silently.
        attributes = {name: value for name, value in cls.__dict__.items() if not callable(value)}
        # Validate when the task class is created (i.e. when the decorator runs), not at
        # the first call; class-based tasks without a name yet are built on first use.
        run = cls.__dict__.get("run") if cls.name else None
        name = cls.name or cls.__qualname__
        cls._singleton_options = cls.declare_singleton(name, attributes, run, cls.singleton)

    @classmethod
    def declare_singleton(
        cls,
        name: str,
        keywords: Mapping[str, object],
        run: Callable[..., object] | staticmethod[..., object] | None,
        singleton: Mapping[str, object] | None,
        *,
        decorator: bool = False,
    ) -> SingletonOptions | None:
        """What declaring a singleton task does, however it is written: its Celery
        ``keywords`` refused where an option of ours or an incumbent's is among them (the
        fix differs for ``@singleton_task``'s keywords, ``decorator``, and for class
        attributes), the worker's receivers installed, and with ``run`` its options built."""
        refuse_task_options(name, keywords, misplaced=not decorator)
        hooks.install()  # the worker's receivers, once a singleton task exists
        tracing.install()  # span events, where opentelemetry-api is installed
        return None if run is None else SingletonOptions.build(name, run, singleton)

    @classmethod
    def on_bound(cls, app: Celery) -> None:
        super().on_bound(app)
        events.follow(app)  # a producer's refusals as events, where it sends task-sent events
        if isinstance(cls.name, str):
            metrics.known(cls.name)  # its series shown at 0 before anything is counted
        # On a Redis broker a dispatch's hold rides its message's push, a run's release
        # its result's write: the one switch, read as the first singleton task is bound.
        # (None is the default, True; a value neither is refused at the first call.)
        if app.conf.get("singleton_lock_ride_broker") is False:
            broker.uninstall(app)
        else:
            broker.install(app)
        broker.on_purge(app, partial(give_up_purged, app))  # a purge gives up its messages' holds
        # Celery's tracer stores STARTED before it calls the task, for every delivery:
        # also for one this library then drops without a trace (a replaced message, a
        # copy of the running one, a requeue). Under an id whose run stored SUCCESS a
        # moment before, that write can win (the backend's check-then-set is not
        # atomic) and every later AsyncResult(id).get() waits for ever. The task
        # stores STARTED itself, once it holds its lease (see __call__).
        if cls.track_started:
            cls.singleton_track_started = True
            cls.track_started = False
        if cls.name and "run" in cls.__dict__:
            warn_if_results_are_short(
                cls.name, cls.singleton_options().idempotency, app.conf, bool(cls.ignore_result)
            )

    @classmethod
    def singleton_options(cls) -> SingletonOptions:
        options = cls.__dict__.get("_singleton_options")
        if options is None:
            # app.register_task(Cls()) names the instance, not the class: the same name,
            # made the way Celery makes it.
            name = cls.name or cls.app.gen_task_name(cls.__name__, cls.__module__)
            options = SingletonOptions.build(name, cls.__dict__.get("run", cls.run), cls.singleton)
            cls._singleton_options = options
        return options

    # -- what the body sees -------------------------------------------------------------

    @property
    def lease(self) -> Lease:
        """The running lease of this execution: ``fence``, ``check()``."""
        lease: Lease | None = getattr(self.request, "singleton_lease", None)
        if lease is None:
            raise RuntimeError(
                f"{self.name}: self.lease exists only while the task runs in a worker or "
                "eagerly (apply(), task_always_eager), not when it is called as a function"
            )
        return lease

    @property
    def singleton_context(self) -> TaskContext:
        """This task's options, lock stores and lease times, for its helpers."""
        return TaskContext(self.app, self.name, self.singleton_options)

    # -- dispatch -------------------------------------------------------------------------

    def apply_async(  # noqa: PLR0917  (Celery's own signature)
        self,
        args: Sequence[object] | None = None,
        kwargs: Mapping[str, object] | None = None,
        task_id: str | None = None,
        producer: Producer | None = None,
        link: object = None,
        link_error: object = None,
        shadow: str | None = None,
        **options: object,
    ) -> AsyncResult:
        # dedupe=False per call: publish without the queue-level check (the execution
        # level still excludes duplicates). For sweeps that re-drive work they believe
        # lost: the hold may belong to a message stuck in a dead worker's prefetch.
        if options:
            refuse_call_options(self.name, options)
        redrive = options.pop("dedupe", True) is False
        # A requeue passes the pending call's hold on (a dict of its headers) or nothing.
        own = options.pop(BYPASS_OPTION, False)
        bypass = own or redrive
        if not own:  # (a delay of the library's own is made one the broker takes: publish)
            refuse_as_celery(self, (args or (), kwargs or {}), options)
        call = Dispatch(
            self,
            self._dispatch_facts(),
            args,
            kwargs,
            options,
            task_id,
            producer or options.pop("publisher", None),  # (Celery's old alias)
            link,
            link_error,
            shadow,
            super().apply_async,
            bypass=bypass,
            redrive=redrive,
        )
        if task_id is not None:
            request = self.request
            running: Lease | None = getattr(request, "singleton_lease", None)
            if running is not None and task_id == request.id:
                # A cancelled run is not retried (autoretry_for included): it ends REVOKED.
                if running.cancelled:
                    running.check()
                # Celery's retry re-sends the running task under the same id: the key
                # passes from this execution to the retry's message, with no gap.
                return send_retry(
                    call,
                    running,
                    token=retry_token(task_id, header(request, TOKEN_HEADER), request.retries),
                    handed_over=partial(setattr, request, _HANDED_OVER, True),
                )
        # Our own resends (a dict of a held call's headers, or True) are the message sent
        # again, its key in its headers: a repeat answered here would send nothing.
        if own:
            return route.dispatch(call)
        key = key_of_call(self.name, call.facts.options, call.call, options)
        return route.dispatch(call) if key is None else send_once(call, key, route.dispatch)

    def apply_many(
        self,
        items: Iterable[Sequence[object] | Signature],
        *,
        producer: Producer | None = None,
        **options: object,
    ) -> list[AsyncResult]:
        """Dispatch many calls of this task at once: one ``AsyncResult`` per item, in order.

        An item is a tuple of positional arguments, or a signature of this task (its args,
        kwargs and options, over ``options``). A duplicate, within the batch or of a key
        already held, gets the holder's ``AsyncResult`` (as ``on_duplicate="return"``), and
        one message is sent per distinct key. The holds are decided in one lock-store
        script call and the messages published in one broker pipeline (kombu's
        ``Producer.batch()`` where the transport has it), each built by Celery's own
        ``apply_async``. Calls that cannot be decided together (``publish.many``) are
        sent by ``apply_async``, one at a time."""
        facts = self._dispatch_facts()
        batch = items_of(self, items, options)
        return send_many(self, facts, batch, partial(self._batched_call, facts, producer), producer)

    def _batched_call(self, facts: TaskFacts, producer: Producer | None, item: Item) -> Dispatch:
        """One call of an ``apply_many`` batch, checked as ``apply_async`` checks a call."""
        args, kwargs, options = item
        if options:
            refuse_call_options(self.name, options)
        for decided in ("dedupe", "idempotency_key"):  # (True, None: as if not given)
            options.pop(decided, None)
        refuse_as_celery(self, (args, kwargs), options)
        task_id = options.pop("task_id", None)
        shadow = options.pop("shadow", None)
        return Dispatch(
            self,
            facts,
            args,
            kwargs,
            options,
            task_id if isinstance(task_id, str) else None,
            producer,
            None,
            None,
            shadow if isinstance(shadow, str) else None,
            super().apply_async,
            bypass=False,
            redrive=False,
        )

    def _dispatch_facts(self) -> TaskFacts:
        """What every dispatch of this task reads (``TaskFacts``), made again when the
        app's lock stores or the task's options were replaced since."""
        facts = self._facts
        options = self.singleton_options()
        if facts is None or not facts.current(options):
            facts = TaskFacts(self.app, self.name, options)
            self._facts = facts
        return facts

    # -- execution -----------------------------------------------------------------------

    def on_cancel(self, task_id: str, lease: Lease) -> None:
        """Called (on a thread of its own) when a newer call cancels this run
        (``on_duplicate="cancel"``); ``self.lease.check()`` raises from then on."""

    def _delivery(self, request: Context) -> Delivery:
        """This message as its execution sees it: read through, acted on by two calls."""

        def store_state(meta: object, state: str) -> None:
            self.backend.store_result(request.id, meta, state, request=request)

        def resend(
            countdown: float, headers: dict[str, object], options: dict[str, object]
        ) -> None:
            # Same id, links, chain and options as this message (what Celery's retry
            # re-sends), without counting as a retry of the task's own max_retries.
            signature = self.signature_from_request(request, countdown=countdown, headers=headers)
            signature.apply_async(**options)

        def keep(headers: dict[str, object], options: dict[str, object]) -> bytes | None:
            # As a requeue would send it, kept for its turn (``broker.turn_sweep``).
            return kept_call(self.signature_from_request(request, headers=headers), options)

        return Delivery(
            context=self.singleton_context,
            request=request,
            sender=self,
            keeps_results=not (
                request.is_eager or getattr(request, "ignore_result", False) or self.ignore_result
            ),
            store_state=store_state,
            resend=resend,
            keep=keep,
        )

    def __call__(self, *args: object, **kwargs: object) -> object:
        request = self.request
        if request.called_directly or request.id is None:
            # Called as a plain function: no message, no duplicate to exclude.
            return super().__call__(*args, **kwargs)
        events.follow_remote()  # the worker's enable_events / disable_events, if it had any
        # An attached call (a canvas member whose key another call held) ends with that
        # call's outcome: Celery's tracer stores it under its own id, sends its links.
        answered = None if request.is_eager else answer_of(self, request)
        if answered is not None:
            return answered.answer()
        # Celery's Task.__call__ would push a fresh, id-less request over the worker's;
        # the worker's tracer has pushed the real one already, so run the body directly.
        began = time.monotonic()
        execution = Execution(self._delivery(request), args, kwargs)
        if not request.is_eager and eta.ahead(execution.delivery):
            # Early for its own ETA (a countdown longer than the broker lets it wait):
            # sent on with its hold, before anything is taken or counted.
            eta.send_on(execution.delivery, execution.lock_name, execution.handed)
        lease = execution.take()
        call_args, call_kwargs = execution.call  # a later call's, if it left them here
        acquired = time.monotonic()
        request.singleton_lease = lease
        singleton_signals.lease_taken(self, lease, request.id, acquired - began)
        if self.singleton_track_started and not request.is_eager:
            results.store_started(self, request)
        cancels.watch(self, request, lease)
        ran = False  # the body was called (a replayed outcome is not a run that failed)
        try:
            replay = replays.begin(
                self.singleton_context,
                request,
                execution.call,
                name=lease.name,
                sender=self,
                results=partial(replays.kept_results, self, request),
            )
            if replay is not None:
                return replay.answer()
            ran = True
            return self.run(*call_args, **call_kwargs)
        except Exception as error:
            cancels.ended(self, request, error, lease)  # REVOKED, if it was cancelled
            if ran:
                failed_run(self.singleton_context, request, error, lease)
            raise
        finally:
            request.singleton_lease = None
            in_turn.release_also_held(
                execution.delivery,
                self.singleton_context,
                execution.also_held,
                eager=bool(request.is_eager),
            )
            if lease.token and getattr(request, _HANDED_OVER, False):
                handed = singleton_signals.lease_handed_over  # its retry's message holds it
                singleton_signals.held_since(handed, self, lease.name, request.id, acquired)
            elif lease.token:
                end = partial(self._release_at_end, request, lease, acquired)
                # A run with an idempotency key keeps its lease until its outcome is
                # written, after Celery stored the result: no copy starts in between.
                if not replays.release_after_end(request, end):
                    end(ride=True)

    def _release_at_end(
        self, request: Context, lease: Lease, acquired: float, *, ride: bool
    ) -> None:
        context = self.singleton_context
        lock_ride(self.app).release_at_end(self, request, context, lease, ride=ride)
        released = singleton_signals.lease_released
        singleton_signals.held_since(released, self, lease.name, request.id, acquired)


__all__ = ["SingletonOptions", "SingletonTask"]
