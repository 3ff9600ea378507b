"""A lock store's URL: its scheme, its parts, its checks, and its form without a password."""

from __future__ import annotations

import re
from urllib.parse import SplitResult, parse_qsl, unquote, urlencode, urlsplit

from ...exceptions import ConfigurationError

STANDALONE_SCHEMES = ("redis", "rediss", "unix", "redis+socket", "valkey", "valkeys")
# Valkey's own URL forms: the same protocol, read as redis:// and rediss:// (TLS).
VALKEY_SCHEMES = {"valkey": "redis", "valkeys": "rediss"}
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SENTINEL_SCHEMES = ("sentinel", "sentinels")
REDLOCK_SCHEMES = ("redlock", "redlocks")
SCHEMES = STANDALONE_SCHEMES + CLUSTER_SCHEMES + SENTINEL_SCHEMES + REDLOCK_SCHEMES
# A password given as a query parameter (redis-py reads ?password=, Sentinel's too).
_QUERY_SECRET = re.compile(r"([?&](?:sentinel_)?password=)[^&;#]*", re.IGNORECASE)


def scheme_of(url: str) -> str:
    return urlsplit(url).scheme.lower()


def failover_urls(urls: object) -> list[str]:
    """Every URL of a failover list (``"redis://a;redis://b"``, or a list or tuple of
    them), each stripped, empty ones left out."""
    return [url for url in (one.strip() for one in _listed(urls).split(";")) if url]


def first_url(urls: object) -> str:
    """The URL a failover list connects to first, as kombu reads it: the part before the
    first ``;``, stripped; "" for none."""
    return _listed(urls).split(";", 1)[0].strip()


def _listed(urls: object) -> str:
    # Celery and kombu take a failover list as "redis://a;redis://b" or a list or tuple.
    if isinstance(urls, list | tuple):
        return ";".join(str(url) for url in urls)
    return str(urls or "")


def redis_url(url: str) -> str:
    """``url`` in redis-py's own scheme: Valkey's ``valkey://`` and ``valkeys://`` are
    ``redis://`` and ``rediss://`` (the same protocol); every other form as it is."""
    scheme = scheme_of(url)
    if scheme not in VALKEY_SCHEMES:
        return url
    return VALKEY_SCHEMES[scheme] + url[url.index(":") :]


def redlock_masters(url: str) -> list[str]:
    """``redlock://[[user]:password@]host1:port1,host2:port2,...[/db][?query]`` as one
    ``redis://`` URL per master (``redlocks://``: ``rediss://``, TLS); the credentials,
    database and query apply to every master."""
    check_userinfo(url)
    scheme, _, rest = url.partition("://")
    userinfo, at, located = rest.rpartition("@")
    hosts = re.split(r"[/?]", located, maxsplit=1)[0]
    tail = located[len(hosts) :]
    redis_scheme = "rediss" if scheme.lower() == "redlocks" else "redis"
    found = []
    for text in hosts.split(","):
        host, port = host_port(text.strip(), 6379, url)
        shown = f"[{host}]" if ":" in host else host
        found.append(f"{redis_scheme}://{userinfo}{at}{shown}:{port}{tail}")
    return found


def unix_url(url: str) -> str:
    """kombu's ``redis+socket:///path?virtual_host=N`` as redis-py's ``unix:///path?db=N``
    (kombu names the database ``virtual_host``; redis-py takes ``db``)."""
    part = urlsplit(url)
    query = [("db" if k == "virtual_host" else k, v) for k, v in parse_qsl(part.query)]
    rest = urlencode(query)
    auth = url[len("redis+socket://") :].split("/", 1)[0]
    return f"unix://{auth}{part.path}" + (f"?{rest}" if rest else "")


def credentials(part: SplitResult) -> dict[str, str]:
    found = {}
    if part.username:
        found["username"] = unquote(part.username)
    if part.password:
        found["password"] = unquote(part.password)
    return found


def host_port(text: str, default_port: int, url: str) -> tuple[str, int]:
    """``host``, ``host:port``, ``[::1]:port`` -> (host, port)."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.lstrip(":")
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host, port = text, ""
    try:
        return host or "localhost", int(port) if port else default_port
    except ValueError:
        raise ConfigurationError(f"lock store URL {redact(url)}: bad port in {text!r}") from None


def redact(url: str) -> str:
    """``url`` without its password, however malformed the URL is.

    Not through ``urlsplit``: a password with an unencoded ``#``, ``/`` or ``?`` splits
    there and would be shown in part. The user information is everything between
    ``://`` and the last ``@``; a password in the query is hidden too.
    """
    parts = []
    for one in url.split(";"):
        shown = one.strip()
        scheme, sep, rest = shown.partition("://")
        userinfo, at, host = rest.rpartition("@")
        if sep and at and ":" in userinfo:
            shown = f"{scheme}://{userinfo.partition(':')[0]}:***@{host}"
        parts.append(_QUERY_SECRET.sub(r"\1***", shown))
    return ";".join(parts)


def check_userinfo(url: str) -> None:
    """Refuse a user or password with a character a URL reserves: the URL would split
    there, and any message about the rest (a "bad port") would quote part of it."""
    for one in failover_urls(url):
        userinfo = one.partition("://")[2].rpartition("@")[0]
        if any(c in userinfo for c in "#/?@[]"):
            raise ConfigurationError(
                f"lock store URL {redact(url)} is not valid: its user or password has a "
                "character a URL reserves (# / ? @ [ ]); percent-encode the password, e.g. "
                "urllib.parse.quote(password, safe='')"
            )


def check_db_path(url: str) -> None:
    """redis-py reads ``/abc`` as database 0 without a word: refuse a path that is not one."""
    path = urlsplit(url).path.strip("/")
    if path and not path.isdigit():
        raise ConfigurationError(
            f"lock store URL {redact(url)}: {path!r} is not a database number; write "
            "redis://host:6379/0 (or ?db=N)"
        )
