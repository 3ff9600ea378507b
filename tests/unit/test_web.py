"""The locks page's parts that need no server: its settings, its query and paging, and its
refusals (auth, CSRF, releases off), on an app whose lock store is ``memory://``."""

from __future__ import annotations

import base64
import io
import uuid
from collections.abc import Iterator
from urllib.parse import urlencode

import pytest
from celery import Celery

from celery_singleton_lock import ConfigurationError, singleton_task
from celery_singleton_lock.contrib.locks import LockRow
from celery_singleton_lock.contrib.web import LocksPage, WebSettings
from celery_singleton_lock.contrib.web.listing import MAX_RANKED, Query, page_of


def row(name: str, age: float | None, state: str = "running", task: str = "t") -> LockRow:
    return LockRow(
        name=name, key=f"p:{{{name}}}", task=task, task_id=f"id-{name}", state=state,
        worker=None, pid=None, age=age, ttl=1.0, fence=None, lock_name=name, base_name=name,
        role=None, token=f"x|h|1|1-2|id-{name}",
    )  # fmt: skip


@pytest.fixture(name="app")
def fixture_app() -> Iterator[Celery]:
    app = Celery("web-units", set_as_current=False)
    app.conf.update(singleton_lock_url="memory://", task_always_eager=True)

    # A name of its own per app: Celery warns when one name meets two callables.
    @singleton_task(app=app, key=["item"], name=f"web-units.sync.{uuid.uuid4().hex}", shared=False)
    def sync(item: str) -> str:
        return item

    try:
        yield app
    finally:
        app.close()


class TestSettings:
    def test_the_app_s_settings_then_keywords(self, app: Celery) -> None:
        app.conf.singleton_lock_web_port = 7000
        app.conf.singleton_lock_web_prefix = "locks/"
        settings = WebSettings.from_app(app, port=7001, allow_release=True)
        assert (settings.host, settings.port, settings.prefix) == ("127.0.0.1", 7001, "/locks")
        assert settings.allow_release is True
        assert settings.basic_auth is None

    @pytest.mark.parametrize(
        ("name", "value", "says"),
        [
            ("port", "http", "singleton_lock_web_port must be a port number"),
            ("port", 70000, "must be a port number"),
            ("allow_release", "yes", "must be True or False"),
            ("refresh", -1, "must be seconds"),
            ("prefix", "/a b", "must be a URL path"),
            ("basic_auth", "no-colon-here", "must be 'user:password'"),
            ("basic_auth", ":only-a-password", "needs both a user and a password"),
        ],
    )
    def test_a_bad_value_is_refused_naming_the_setting(
        self, app: Celery, name: str, value: object, says: str
    ) -> None:
        with pytest.raises(ConfigurationError, match=says) as refused:
            WebSettings.from_app(app, **{name: value})
        assert "only-a-password" not in str(refused.value)  # never echoes credentials
        assert "no-colon-here" not in str(refused.value)

    def test_an_unknown_keyword_is_refused(self, app: Celery) -> None:
        with pytest.raises(ConfigurationError, match="unknown page setting"):
            WebSettings.from_app(app, hots="localhost")

    def test_the_password_is_kept_out_of_the_repr(self, app: Celery) -> None:
        settings = WebSettings.from_app(app, basic_auth="ops:hunter2")
        assert "hunter2" not in repr(settings)
        assert settings.credentials_match("ops", "hunter2")
        assert not settings.credentials_match("ops", "hunter3")


class TestQueryAndPaging:
    def test_nonsense_in_the_query_string_falls_back_to_defaults(self) -> None:
        query = Query.parse({"state": "sleeping", "page": "-4", "per": "x", "sort": "up"})
        assert (query.state, query.page, query.per, query.sort) == ("", 1, 50, "oldest")
        assert Query.parse({"page": str(10**9)}).page == MAX_RANKED

    def test_oldest_or_newest_first_unknown_ages_last_and_pages_cut_in_order(self) -> None:
        rows = [row(f"n{age}", age) for age in (5.0, 1.0, 9.0, 3.0)] + [row("unknown", None)]
        oldest = page_of(rows, Query(per=2))
        assert [r.name for r in oldest.rows] == ["n9.0", "n5.0"]
        assert (oldest.total, oldest.pages) == (5, 3)
        second = page_of(rows, Query(per=2, page=2))
        assert [r.name for r in second.rows] == ["n3.0", "n1.0"]
        assert [r.name for r in page_of(rows, Query(per=2, page=3)).rows] == ["unknown"]
        newest = page_of(rows, Query(sort="newest", per=10))
        assert [r.name for r in newest.rows] == ["n1.0", "n3.0", "n5.0", "n9.0", "unknown"]

    def test_filters_and_counts_per_state(self) -> None:
        rows = [row("a", 1.0, "running", "t1"), row("b", 2.0, "queued", "t1"),
                row("c", 3.0, "queued", "t2")]  # fmt: skip
        page = page_of(rows, Query(task="t1", state="queued"))
        assert [r.name for r in page.rows] == ["b"]
        assert page.counts == {"running": 1, "queued": 1}  # the task's, whatever the state
        assert [r.name for r in page_of(rows, Query(search="ID-C")).rows] == ["c"]

    def test_the_query_string_keeps_what_differs_from_the_defaults(self) -> None:
        query = Query(task="t1", search="x y", sort="newest", page=3)
        assert query.params(page=1) == "task=t1&q=x+y&sort=newest"


def call(page: LocksPage, path: str, method: str = "GET", **extra: object) -> tuple[str, bytes]:
    environ: dict[str, object] = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": ""}
    environ.update(extra)
    response = page.handle(environ)
    return response.status, response.body


def post(form: dict[str, str], **extra: object) -> dict[str, object]:
    body = urlencode(form).encode()
    return {
        "CONTENT_TYPE": "application/x-www-form-urlencoded", "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body), **extra,
    }  # fmt: skip


class TestRefusals:
    def test_basic_auth_refuses_without_the_right_credentials(self, app: Celery) -> None:
        page = LocksPage(app, basic_auth="ops:pw")
        assert call(page, "/")[0] == "401 Unauthorized"
        wrong = "Basic " + base64.b64encode(b"ops:nope").decode()
        assert call(page, "/", HTTP_AUTHORIZATION=wrong)[0] == "401 Unauthorized"
        assert call(page, "/", HTTP_AUTHORIZATION="Basic !!notbase64")[0] == "401 Unauthorized"
        right = "Basic " + base64.b64encode(b"ops:pw").decode()
        assert call(page, "/", HTTP_AUTHORIZATION=right)[0] == "200 OK"

    def test_releases_off_csrf_and_other_sites_are_refused(self, app: Celery) -> None:
        read_only = LocksPage(app)
        status, body = call(read_only, "/release", "POST", **post({"key": "k"}))
        assert status == "403 Forbidden"
        assert b"--allow-release" in body
        page = LocksPage(app, allow_release=True)
        form = {"key": "k", "token": "t", "csrf": page.csrf_token("")}
        assert (
            b"token is missing" in call(page, "/release", "POST", **post({**form, "csrf": "x"}))[1]
        )
        elsewhere = post(form, HTTP_ORIGIN="https://evil.example", HTTP_HOST="127.0.0.1:5556")
        assert b"another site" in call(page, "/release", "POST", **elsewhere)[1]
        cross = post(form, HTTP_SEC_FETCH_SITE="cross-site")
        assert b"another site" in call(page, "/release", "POST", **cross)[1]
        multipart = {**post(form), "CONTENT_TYPE": "multipart/form-data; boundary=x"}
        assert b"Not a form post" in call(page, "/release", "POST", **multipart)[1]
        # The page's own form, for a lock that is not held: nothing to release.
        status, _ = call(
            page, "/release", "POST", **post(form, HTTP_ORIGIN="http://h", HTTP_HOST="h")
        )
        assert status == "303 See Other"

    def test_unknown_pages_methods_and_static_files(self, app: Celery) -> None:
        page = LocksPage(app)
        assert call(page, "/nope")[0] == "404 Not Found"
        assert call(page, "/release")[0] == "405 Method Not Allowed"
        assert call(page, "/static/../settings.py")[0] == "404 Not Found"
        status, script = call(page, "/static/app.js")
        assert status == "200 OK"
        assert b"DOMParser" in script
        assert call(page, "/", "HEAD")[0] == "200 OK"
