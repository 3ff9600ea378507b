"""What the page shows: the list, one lock (liveness, task options), and releases.

Every read goes through the app's lock store as the CLI's does (``locks.app_rows``); a
release is the CLI's too: owner-checked by the exact token the page showed, refused
while the holder lives unless the operator confirmed it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from ..._time import human
from ...config.options import is_singleton
from ...config.stores import LockStores
from ...exceptions import SingletonLockError
from ...lease import ReleaseResult
from .. import idempotency_keys
from .. import limits as operator_limits
from ..liveness import Liveness, Verdict
from ..lock_history import entries_of, shown
from ..locks import (
    LockRow,
    app_rows,
    attached_calls,
    attached_counts,
    family_rows,
    new_call,
    operator_record,
    release,
)
from .http import Request, Response
from .listing import ORPHAN_STATES, PAGE_STATES, Page, Query, page_of

if TYPE_CHECKING:
    from celery import Celery
    from jinja2 import Environment

    from ...task import SingletonTask
    from .page_settings import WebSettings

logger = logging.getLogger(__name__)

# How long the page waits for the workers' answers (a ping waits this long in full).
LIVENESS_TIMEOUT = 1.0
# A lock page shows its history's newest entries, this many.
HISTORY_SHOWN = 50
# Holders asked after at most, for the orphaned filter (narrow it by task or search).
MAX_ORPHAN_CHECKS = 10_000
# Idempotency keys shown at most, newest first (search or filter to find older ones).
MAX_KEYS = 500


class Views:
    def __init__(
        self,
        app: Celery,
        settings: WebSettings,
        templates: Environment,
        csrf_token: Callable[[str], str],
    ) -> None:
        self.app = app
        self.settings = settings
        self.templates = templates
        self.csrf_token = csrf_token
        self.templates.filters["human"] = human

    # -- pages -------------------------------------------------------------------------

    def index(self, request: Request) -> Response:
        """The list: filters, search, sort by age, paging."""
        query = Query.parse(request.params)
        whys: dict[str, str] = {}
        try:
            store = LockStores.for_app(self.app).lock
            started = time.perf_counter()
            if query.state == "orphaned":
                page, whys = self._orphans(query)
            else:
                seen = Liveness(self.app, timeout=LIVENESS_TIMEOUT).as_seen
                page = page_of(map(seen, app_rows(self.app, store)), query)
            attached = attached_counts(store, page.rows)  # the page's rows only
            took = time.perf_counter() - started
        except SingletonLockError as error:
            return self.message(request, "503 Service Unavailable", "Lock store error", str(error))
        tasks = sorted(name for name, task in self.app.tasks.items() if _is_singleton(task))
        return self.render(
            request,
            "list.html",
            page=page,
            query=query,
            states=PAGE_STATES,
            tasks=tasks,
            took=took,
            whys=whys,
            attached=attached,
        )

    def _orphans(self, query: Query) -> tuple[Page, dict[str, str]]:
        """The locks whose holder is gone, and why (as ``celery singleton orphans``)."""
        candidates = [
            row
            for row in app_rows(self.app, LockStores.for_app(self.app).lock)
            if row.state in ORPHAN_STATES and query.wants(row)
        ][:MAX_ORPHAN_CHECKS]
        liveness = Liveness(self.app, timeout=LIVENESS_TIMEOUT)
        liveness.prepare(candidates)
        verdicts = {row.key: liveness.verdict(row) for row in candidates}
        gone = [row for row in candidates if verdicts[row.key].alive is False]
        page = page_of(gone, replace(query, state=""))
        return replace(page, query=query), {key: v.why for key, v in verdicts.items()}

    def idempotency(self, request: Request) -> Response:
        """The idempotency keys: each key's first call, its state and window (a search
        by key, task or task id, and a state filter; newest first, at most MAX_KEYS)."""
        search = request.params.get("q", "").strip()
        state = request.params.get("state", "")
        try:
            store = LockStores.for_app(self.app).lock
            found = [
                record
                for record in idempotency_keys.records(store)
                if (not state or record.state == state)
                and (not search or search in (record.key, record.task, record.call, record.by))
            ]
        except SingletonLockError as error:
            return self.message(request, "503 Service Unavailable", "Lock store error", str(error))
        found.sort(key=lambda record: record.accepted_at, reverse=True)
        return self.render(
            request,
            "idempotency.html",
            keys=found[:MAX_KEYS],
            total=len(found),
            search=search,
            state=state,
            states=list(idempotency_keys.MEANINGS),
            meanings=idempotency_keys.MEANINGS,
            now=time.time(),
        )

    def limits(self, request: Request) -> Response:
        """Every task with a rate or a limit: the code's values beside the override an
        operator set (``celery singleton limits set``), and since when, by whom."""
        try:
            found = operator_limits.rows(self.app)
        except SingletonLockError as error:
            return self.message(request, "503 Service Unavailable", "Lock store error", str(error))
        return self.render(request, "limits.html", limits=found, now=time.time())

    def lock(self, request: Request) -> Response:
        """One lock: each hold with its holder's liveness, the task's options, what a
        new call would get, and release forms where releases are on."""
        key = request.params.get("key", "")
        done = request.params.get("done", "")
        try:
            family = self._family(key)
        except SingletonLockError as error:
            return self.message(request, "503 Service Unavailable", "Lock store error", str(error))
        store = LockStores.for_app(self.app).lock
        try:
            name, entries = entries_of(store, key, HISTORY_SHOWN) if key else ("", [])
        except SingletonLockError:
            name, entries = "", []  # the family's read said what is wrong, if anything
        events = [shown(entry) for entry in entries]
        if not family:
            return self.render(
                request,
                "lock.html",
                status="200 OK" if events else "404 Not Found",
                key=key,
                lock_name=None,
                history_of=name,
                events=events,
                holds=[],
                done=done,
                options=[],
                outlook="",
            )
        liveness = Liveness(self.app, timeout=LIVENESS_TIMEOUT)
        liveness.prepare(family)
        holds = [(row, liveness.verdict(row)) for row in family]
        task = self._task(family[0])
        outlook = new_call(task.singleton_options() if task else None, family)
        try:
            attached = attached_calls(store, family[0].base_name)
        except SingletonLockError:
            attached = []  # the family's read said what is wrong, if anything
        return self.render(
            request,
            "lock.html",
            key=key,
            attached=attached,
            lock_name=family[0].base_name,
            task_name=family[0].task,
            holds=[(row, verdict, _needs_confirmation(row, verdict)) for row, verdict in holds],
            done=done,
            options=task_options(task),
            outlook=outlook,
            events=events,
            history_of=name,
        )

    def release(self, request: Request) -> Response:
        """Release the hold the form names, if its holder still holds it (exact token);
        a live holder only with the confirmation."""
        key, token = request.form.get("key", ""), request.form.get("token", "")
        confirmed = request.form.get("confirm") == "yes"
        try:
            row = next((r for r in self._family(key) if r.key == key), None)
            if row is None or row.token != token:
                return self._moved_on(request, key)
            if row.state == "limited":
                return self.message(
                    request,
                    "409 Conflict",
                    "Not a lock",
                    f"{row.name} is a rate's schedule: it frees itself as its slots pass.",
                )
            liveness = Liveness(self.app, timeout=LIVENESS_TIMEOUT)
            liveness.prepare([row])
            verdict = liveness.verdict(row)
            if _needs_confirmation(row, verdict) and not confirmed:
                return self.render(
                    request, "confirm.html", status="409 Conflict", row=row, verdict=verdict
                )
            by = f"locks page, {request.user}" if request.user else "locks page"
            result = release(
                LockStores.for_app(self.app).lock, row, operator_record(self.app, row, by)
            )
        except SingletonLockError as error:
            return self.message(request, "503 Service Unavailable", "Lock store error", str(error))
        if result is not ReleaseResult.RELEASED:
            return self._moved_on(request, key)
        logger.warning(
            "released %s (%s, task %s) from the locks page%s",
            row.lock_name,
            row.state,
            row.task_id,
            f" by {request.user}" if request.user else "",
        )
        return self._see(request, key, "released")

    def message(self, request: Request, status: str, title: str, text: str) -> Response:
        return self.render(request, "message.html", status=status, title=title, text=text)

    # -- helpers -----------------------------------------------------------------------

    def render(
        self, request: Request, template: str, status: str = "200 OK", **context: object
    ) -> Response:
        page = self.templates.get_template(template).render(
            root=request.base,
            settings=self.settings,
            csrf=self.csrf_token(request.user) if self.settings.allow_release else "",
            where=_where(self.app),
            **context,
        )
        return Response(status, page.encode())

    def _family(self, key: str) -> list[LockRow]:
        """The family of the lock ``key`` (a Redis key, or a lock's name) belongs to: its
        own, its companions, its slots, its rate. One round trip, however many locks the
        store has."""
        return family_rows(self.app, LockStores.for_app(self.app).lock, key) if key else []

    def _task(self, row: LockRow) -> SingletonTask | None:
        task = self.app.tasks.get(row.task) if row.task else None
        return task if _is_singleton(task) else None

    def _moved_on(self, request: Request, key: str) -> Response:
        return self._see(request, key, "changed")

    def _see(self, request: Request, key: str, done: str) -> Response:
        where = f"{request.base}/lock?{urlencode({'key': key, 'done': done})}"
        return Response("303 See Other", b"", headers=[("Location", where)])


def task_options(task: SingletonTask | None) -> list[tuple[str, str]]:
    """The task's singleton options as (name, value) for the lock page, its times as
    they apply (the app's defaults where the task sets none)."""
    if task is None:
        return []
    opts, context = task.singleton_options(), task.singleton_context
    shown = [
        ("mode", opts.mode.name),
        ("lock", opts.lock),
        ("ttl", human(context.ttl)),
        ("queue_ttl", human(context.queue_ttl)),
    ]
    for name in ("throttle", "debounce", "max_wait", "limit", "rate"):
        value = getattr(opts, name)
        if value is not None:
            shown.append((name, human(value) if isinstance(value, float) else str(value)))
    shown.append(("on_duplicate", str(opts.on_duplicate)))
    shown.append(("on_contention", repr(opts.on_contention)))
    return shown


def _needs_confirmation(row: LockRow, verdict: Verdict) -> bool:
    """A live holder (or one that may be) is released only when the operator confirms,
    as the CLI's ``release`` needs --force."""
    return bool(verdict.alive) or (verdict.alive is None and row.state != "throttled")


def _is_singleton(task: object) -> bool:
    return task is not None and is_singleton(task)


def _where(app: Celery) -> str:
    try:
        stores = LockStores.for_app(app)
        return f"{stores.describe()} under prefix {stores.lock.prefix!r}"
    except SingletonLockError as error:
        return f"(not set up: {error})"
