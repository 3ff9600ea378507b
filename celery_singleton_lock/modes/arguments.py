"""A later call's arguments as it leaves them for a started execution of the call it
replaces (``lease.offers``): serialized as the task's own messages are, read back under
the app's ``accept_content``."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence

from kombu.serialization import dumps, loads, prepare_accept_content

# Three fields and the body: the serializer's content type and encoding travel with it.
_SEPARATOR = b"\n"


def dump(serializer: str, args: Sequence[object], kwargs: Mapping[str, object]) -> bytes:
    """``(args, kwargs)`` in ``serializer``'s form (the task's), with how to read it;
    ASCII throughout (the body in base64), so a client that decodes replies reads it."""
    call = [list(args), dict(kwargs)]
    content_type, encoding, body = dumps(call, serializer=serializer)  # type: ignore[no-untyped-call]
    data = body if isinstance(body, bytes) else body.encode(encoding)
    return _SEPARATOR.join([content_type.encode(), encoding.encode(), base64.b64encode(data)])


def load(value: bytes, accept: Sequence[str]) -> tuple[list[object], dict[str, object]]:
    """The arguments ``dump`` wrote (``accept``: the serializers the app takes, as
    ``accept_content`` names them)."""
    content_type, encoding, body = value.split(_SEPARATOR, 2)
    allowed = prepare_accept_content(accept)  # type: ignore[no-untyped-call]
    args, kwargs = loads(  # type: ignore[no-untyped-call]
        base64.b64decode(body), content_type.decode(), encoding.decode(), accept=allowed
    )
    return list(args), dict(kwargs)
