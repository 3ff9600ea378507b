"""A WSGI request as the page's views read it, and the response they give."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Environ = dict[str, Any]


@dataclass
class Request:
    """What a view reads of a WSGI request."""

    environ: Environ
    method: str
    path: str
    params: dict[str, str]
    user: str = ""
    form: dict[str, str] = field(default_factory=dict)

    @property
    def base(self) -> str:
        """The path the page is mounted under (``SCRIPT_NAME``), without a trailing '/'."""
        return str(self.environ.get("SCRIPT_NAME", "")).rstrip("/")


@dataclass
class Response:
    status: str
    body: bytes
    content_type: str = "text/html; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)
