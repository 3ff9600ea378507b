"""The locks page: a WSGI / ASGI app of an app's locks (``celery singleton web``, or mounted).

Needs the ``web`` extra (``pip install 'celery-singleton-lock[web]'``): Jinja2 for the
templates (autoescaping), asgiref for the ASGI app (Django's own), waitress to serve it.
"""

from __future__ import annotations

from .app import LocksPage
from .asgi import asgi_app
from .page_settings import WebSettings

__all__ = ["LocksPage", "WebSettings", "asgi_app"]
