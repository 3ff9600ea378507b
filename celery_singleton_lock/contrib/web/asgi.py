"""The locks page as an ASGI app (a FastAPI or Starlette mount, an ASGI Django project)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asgiref.wsgi import WsgiToAsgi

from .app import LocksPage

if TYPE_CHECKING:
    from celery import Celery


def asgi_app(app: Celery, **settings: object) -> Any:
    """``fastapi_app.mount("/locks", asgi_app(celery_app))``: the page, run in a thread
    per request (its reads of the lock store are blocking), under the mount's path."""
    adapt: Any = WsgiToAsgi  # asgiref leaves it untyped
    return adapt(LocksPage(app, **settings))
