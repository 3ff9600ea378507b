"""The locks page mounted in a Django project: URL patterns whose view hands Django's request to it.

Behind the admin's login, or any decorator of yours (``urls(..., wrap=...)``). Django's CSRF
middleware is left out for it: its release forms carry the page's own CSRF token, signed
with the project's ``SECRET_KEY``.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.conf import settings as django_settings
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, re_path
from django.views.decorators.csrf import csrf_exempt

from .app import LocksPage

if TYPE_CHECKING:
    from celery import Celery

View = Callable[..., HttpResponse]


def urls(
    app: Celery, *, wrap: Callable[[View], View] | None = None, **settings: object
) -> list[URLPattern]:
    """The page's URL patterns, to ``include()`` under the path of your choice.
    ``settings``: as ``LocksPage``'s (``allow_release=True``, ...).

    ``path("admin/locks/", include(urls(celery_app, wrap=admin.site.admin_view)))`` puts it
    behind the admin's login (staff only), as an admin page; any other decorator works too
    for ``wrap`` (``login_required``, ``permission_required(...)``)."""
    if "secret" not in settings:
        # Every process of the project signs the same way (a random secret would not).
        key = str(django_settings.SECRET_KEY).encode()
        settings["secret"] = hashlib.sha256(b"celery-singleton-lock web:" + key).digest()
    page = LocksPage(app, **settings)

    def view(request: HttpRequest, rest: str = "") -> HttpResponse:
        environ: dict[str, Any] = dict(request.META)
        environ["SCRIPT_NAME"] = request.path[: len(request.path) - len(rest)].rstrip("/")
        environ["PATH_INFO"] = "/" + rest
        environ["wsgi.input"] = io.BytesIO(request.body)
        response = page.handle(environ)
        answer = HttpResponse(
            response.body,
            status=int(response.status.split()[0]),
            content_type=response.content_type,
        )
        for name, value in response.headers:
            answer[name] = value
        for name, value in page.security_headers():
            answer.setdefault(name, value)
        return answer

    exempt: View = csrf_exempt(view)
    return [re_path(r"^(?P<rest>.*)$", wrap(exempt) if wrap is not None else exempt)]
