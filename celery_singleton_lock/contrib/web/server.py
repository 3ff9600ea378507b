"""``celery singleton web``'s server: the page under waitress, at the settings' address and path."""

from __future__ import annotations

import waitress

from .app import LocksPage


def serve(page: LocksPage, *, threads: int = 4) -> None:
    """Serve ``page`` until interrupted (waitress: pure Python, a production server)."""
    settings = page.settings
    waitress.serve(
        page,
        host=settings.host,
        port=settings.port,
        url_prefix=settings.prefix,
        threads=threads,
        ident="celery-singleton-lock",
        # Set by an operator who put a proxy in front: trust nothing it did not say.
        clear_untrusted_proxy_headers=True,
    )
