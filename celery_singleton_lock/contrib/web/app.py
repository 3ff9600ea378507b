"""The locks page as a WSGI app: routing, basic auth, CSRF, security headers and static files.

A plain WSGI callable, served by ``celery singleton web``, mounted in a WSGI or ASGI project or
called in a test; links are built from ``SCRIPT_NAME``, so it works under any mount path.
What each page shows is ``views.py``'s.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
from collections.abc import Callable, Iterable
from importlib import resources
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlsplit

from jinja2 import Environment, PackageLoader, select_autoescape

from .http import Environ, Request, Response
from .page_settings import WebSettings
from .views import Views

if TYPE_CHECKING:
    from celery import Celery

StartResponse = Callable[[str, list[tuple[str, str]]], object]
logger = logging.getLogger(__name__)

# A release form is a few fields: anything longer is not one.
MAX_FORM = 16 * 1024
STATIC = {"app.css": "text/css; charset=utf-8", "app.js": "text/javascript; charset=utf-8"}
HEADERS = [
    # Nothing from elsewhere: the page ships its own script and style (no network).
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "same-origin"),
    ("X-Frame-Options", "DENY"),
    ("Cache-Control", "no-store"),
]


class LocksPage:
    """The WSGI app: ``LocksPage(celery_app, allow_release=True, basic_auth="u:p")``;
    keywords override the app's ``singleton_lock_web_*`` settings.

    Serve it with ``celery singleton web`` (waitress), mount it in a WSGI or ASGI project
    (``asgi.py``, ``django.py``), or call it in a test."""

    def __init__(self, app: Celery, **overrides: object) -> None:
        self.settings = WebSettings.from_app(app, **overrides)
        templates = Environment(
            loader=PackageLoader("celery_singleton_lock.contrib.web", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.views = Views(app, self.settings, templates, self.csrf_token)

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        response = self.handle(environ)
        headers = [("Content-Type", response.content_type), *self.security_headers()]
        headers.extend(response.headers)
        headers.append(("Content-Length", str(len(response.body))))
        start_response(response.status, headers)
        return [response.body]

    @staticmethod
    def security_headers() -> list[tuple[str, str]]:
        return list(HEADERS)

    def handle(self, environ: Environ) -> Response:
        """The response to one request (what ``__call__`` sends, and a Django view returns)."""
        try:
            return self._handle(environ)
        except Exception:
            # A broker or worker that cannot be asked (liveness), a template bug: the
            # details go to the log, never to the page.
            logger.exception("the locks page failed on %s", environ.get("PATH_INFO"))
            return Response(
                "500 Internal Server Error",
                b"The page failed: see its log.\n",
                "text/plain; charset=utf-8",
            )

    def _handle(self, environ: Environ) -> Response:
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        method = "GET" if method == "HEAD" else method  # the server drops a HEAD's body
        path = str(environ.get("PATH_INFO", "") or "/")
        params = dict(parse_qsl(str(environ.get("QUERY_STRING", "")), keep_blank_values=True))
        request = Request(environ, method, path, params)
        user = self._user(environ)
        if user is None:
            return Response(
                "401 Unauthorized",
                b"Authentication required.\n",
                "text/plain; charset=utf-8",
                [("WWW-Authenticate", 'Basic realm="celery-singleton-lock", charset="UTF-8"')],
            )
        request.user = user
        if path.startswith("/static/"):
            return self._static(path[len("/static/") :])
        routes: dict[tuple[str, str], Callable[[Request], Response]] = {
            ("GET", "/"): self.views.index,
            ("GET", "/lock"): self.views.lock,
            ("GET", "/idempotency"): self.views.idempotency,
            ("GET", "/limits"): self.views.limits,
            ("POST", "/release"): self._release,
        }
        view = routes.get((method, path))
        if view is None:
            allowed = sorted(m for m, p in routes if p == path)
            if allowed:
                return Response(
                    "405 Method Not Allowed", b"", headers=[("Allow", ", ".join(allowed))]
                )
            return self.views.message(request, "404 Not Found", "Not found", "No such page.")
        return view(request)

    def _user(self, environ: Environ) -> str | None:
        """The authenticated user ('' with no auth set); None: refused."""
        if self.settings.basic_auth is None:
            return ""
        scheme, _, encoded = str(environ.get("HTTP_AUTHORIZATION", "")).partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return user if self.settings.credentials_match(user, password) else None

    def csrf_token(self, user: str) -> str:
        """The release forms' token: the page's secret signs the user it is shown to."""
        return hmac.new(self.settings.secret, b"release:" + user.encode(), "sha256").hexdigest()

    def _release(self, request: Request) -> Response:
        if not self.settings.allow_release:
            return self.views.message(
                request,
                "403 Forbidden",
                "Releases are off",
                "This page was started read-only. Start it with --allow-release (or set "
                "singleton_lock_web_allow_release = True) to release locks from it.",
            )
        refused = self._forged(request)
        if refused:
            return self.views.message(request, "403 Forbidden", "Refused", refused)
        return self.views.release(request)

    def _forged(self, request: Request) -> str:
        """Why this POST is not the page's own form ('' when it is)."""
        environ = request.environ
        if not str(environ.get("CONTENT_TYPE", "")).startswith("application/x-www-form-urlencoded"):
            return "Not a form post."
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_FORM:
            return "The form is too large."
        body = environ["wsgi.input"].read(length).decode("utf-8", "replace")
        request.form = dict(parse_qsl(body, keep_blank_values=True))
        # A browser says where a request comes from: another site's form is refused
        # even before its (unknowable) token is checked.
        origin = environ.get("HTTP_ORIGIN")
        host = environ.get("HTTP_HOST") or environ.get("SERVER_NAME")
        if origin and (origin == "null" or urlsplit(origin).netloc != host):
            return "The form came from another site."
        if environ.get("HTTP_SEC_FETCH_SITE") not in (None, "same-origin", "none"):
            return "The form came from another site."
        given = request.form.get("csrf", "")
        if not hmac.compare_digest(given, self.csrf_token(request.user)):
            return "The form's token is missing or wrong: reload the page and try again."
        return ""

    def _static(self, name: str) -> Response:
        if name not in STATIC:
            return Response("404 Not Found", b"", "text/plain; charset=utf-8")
        body = (
            resources.files("celery_singleton_lock.contrib.web").joinpath("static").joinpath(name)
        )
        return Response("200 OK", body.read_bytes(), STATIC[name])
