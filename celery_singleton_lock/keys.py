"""Canonical lock names from a task name and the arguments of one call.

The sender derives the name before publishing and a worker may derive it again after the
arguments went through Celery's JSON serializer: both must get the same name, and two calls
must share a name only when they are the same call.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any, TypeAlias

from .exceptions import ArgumentsMismatchError, ConfigurationError, KeyDerivationError
from .keyformat import FormatKey
from .lease.names import ROLE_MARK

KeyOption: TypeAlias = "str | Sequence[str] | Callable[..., str] | None"

# Keep lock names short whatever the arguments: readable part + fixed-length digest.
MAX_READABLE = 128
MAX_FORMATTED = 200

# One encoder for every call: json.dumps builds a new one whenever options are given.
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True)


def _digest(document: object) -> str:
    return hashlib.sha256(_JSON.encode(document).encode("ascii")).hexdigest()


def _json_key(key: object, path: str) -> str:
    """A dict key as JSON carries it: JSON object keys are always strings."""
    if isinstance(key, str):
        return str.__str__(key)
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(int(key))
    if isinstance(key, float):
        return float.__repr__(key)
    if key is None:
        return "null"
    raise KeyDerivationError(
        f"cannot derive a lock key: {path} has a dict key of type {type(key).__name__} "
        f"({key!r}), which Celery's JSON serializer cannot carry; pass key= to choose "
        "the arguments that identify the task",
        param=path,
    )


# (type, tag, canonical text) in match order: bool before int (a bool is an int),
# datetime before date (a datetime is a date). Canonical text uses the base type's
# method, so an IntEnum or a str subclass encodes as JSON will carry it.
_SCALARS: tuple[tuple[type, str, Callable[[Any], object]], ...] = (
    (bool, "b", bool),
    (int, "i", lambda v: str(int(v))),
    (float, "f", float.__repr__),
    (str, "s", str.__str__),
    (datetime, "dt", datetime.isoformat),
    (date, "d", date.isoformat),
    (time, "t", time.isoformat),
    (uuid.UUID, "u", str),
    (Decimal, "D", str),
    (bytes, "y", bytes.hex),
)


def encode(value: object, path: str = "argument") -> object:
    """The canonical, type-tagged form of one argument (a JSON-able structure).

    Tags keep ``7`` and ``"7"``, ``1`` and ``1.0`` and ``True`` apart; strings are JSON
    strings, so no separator inside one can collide with the structure around it.
    """
    kind = type(value)
    if kind is str:  # the common cases first, exactly as the table below encodes them
        return ["s", value]
    if kind is int:
        return ["i", str(value)]
    if value is None:
        return ["n"]
    if isinstance(value, list | tuple):
        return ["l", [encode(item, f"{path}[{i}]") for i, item in enumerate(value)]]
    if isinstance(value, dict):
        pairs = [(_json_key(k, path), encode(v, f"{path}[{k!r}]")) for k, v in value.items()]
        return ["m", [list(pair) for pair in sorted(pairs, key=lambda pair: pair[0])]]
    for kind, tag, text in _SCALARS:
        if isinstance(value, kind):
            return [tag, text(value)]
    raise KeyDerivationError(
        f"cannot derive a lock key: {path} is a {type(value).__module__}."
        f"{type(value).__qualname__}, which has no canonical encoding; pass key= with the "
        "parameters that identify the task (e.g. key=['order_id']), a format string, or a "
        "callable returning the lock name",
        param=path,
    )


class _Bound:
    """What ``derive`` reads of a binding, for the plain-parameter fast path."""

    __slots__ = ("arguments",)

    def __init__(self, arguments: dict[str, object]) -> None:
        self.arguments = arguments


class KeySpec:
    """How one task turns a call's arguments into a lock name. Validated when built.

    Arguments are bound to the function's signature (defaults applied, keyword order
    irrelevant) and encoded canonically with a type tag per value (``encode``), in the
    shapes JSON carries (a tuple is a list, a dict key is a string), then hashed.

    ``key`` chooses what identifies a call:

    - ``None``: every argument;
    - a list of parameter names: just those (checked against the signature up front);
    - a format string such as ``"request:{request_idx}"``: the formatted text *is* the lock
      name, not prefixed with the task name, so different tasks naming the same request
      share one lock;
    - a callable: receives the call's arguments by name (defaults applied) and returns
      the lock name as a string, shared across tasks like a format string.
    """

    def __init__(
        self,
        func: Callable[..., object],
        *,
        name: str,
        key: object = None,
        bound: bool = False,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"task name must be a non-empty str, got {name!r}")
        self.name = name
        self.key: KeyOption = None  # as given, once validated below
        signature = inspect.signature(func)
        params = list(signature.parameters.values())
        if bound:
            # bind=True tasks receive the task as their first argument; callers never pass it.
            if not params:
                raise ConfigurationError(
                    f"{name}: bind=True needs a first parameter for the task (self)"
                )
            params = params[1:]
            signature = signature.replace(parameters=params)
        self.signature = signature
        self._param_names = {
            p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        }
        self._var_keyword = next((p.name for p in params if p.kind is p.VAR_KEYWORD), None)
        self._var_positional = any(p.kind is p.VAR_POSITIONAL for p in params)
        # Plain parameters only (no *args, **kwargs, keyword-only or positional-only):
        # calls bind without inspect, which costs more than the rest of a derivation.
        self._plain: tuple[tuple[str, object], ...] | None = None
        if all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params):
            self._plain = tuple((p.name, p.default) for p in params)
        self._fields: tuple[str, ...] = ()
        self._format: FormatKey | None = None
        if callable(key):
            self._check_callable(key)
            self.key = key
            return
        if key is None:
            return
        if isinstance(key, str):
            annotations = {p.name: p.annotation for p in params}
            self._format = FormatKey(name, key, self._param_names, annotations)
            self._check_known(list(self._format.names), f"key {key!r}")
            self._fields = self._format.names
            self.key = key
        elif isinstance(key, Sequence) and all(isinstance(k, str) for k in key):
            names = [str(k) for k in key]
            self._check_known(names, "key")
            self._fields = tuple(names)
            self.key = names
        else:
            raise ConfigurationError(
                f"{name}: key must be None (all arguments), a list of parameter names, a "
                f"format string like 'request:{{request_idx}}', or a callable; got {key!r}"
            )

    def _check_callable(self, key: Callable[..., object]) -> None:
        """A key callable must take the task's arguments by name (``_call``): said now,
        not as a TypeError at every dispatch."""
        if self._var_positional:
            return  # it gets the call as bound, positions and all
        try:
            accepts = inspect.signature(key)
        except (TypeError, ValueError):
            return  # a builtin without a signature: it speaks for itself
        try:
            accepts.bind(**dict.fromkeys(self._param_names))
        except TypeError as error:
            names = ", ".join(sorted(self._param_names))
            raise ConfigurationError(
                f"{self.name}: key callable {getattr(key, '__qualname__', key)!r} cannot take "
                f"the task's arguments by name ({error}); write it as "
                f"key=lambda {names + ', ' if names else ''}**_: ..."
            ) from None

    def _check_known(self, names: list[str], what: str) -> None:
        unknown = [n for n in names if n not in self._param_names]
        if unknown and self._var_keyword is None:
            raise ConfigurationError(
                f"{self.name}: {what} names {unknown} which are not parameters of the task; "
                f"its parameters are {sorted(self._param_names)}"
            )

    def _bind(
        self, args: Sequence[object], kwargs: Mapping[str, object]
    ) -> _Bound | inspect.BoundArguments:
        plain = self._plain
        if plain is not None and len(args) <= len(plain):
            arguments = {name: value for (name, _), value in zip(plain, args, strict=False)}
            complete = True
            for name, value in kwargs.items():
                if name in arguments:
                    complete = False  # given twice: let inspect word the error
                arguments[name] = value
            for name, default in plain[len(args) :]:
                if name not in arguments:
                    if default is inspect.Parameter.empty:
                        complete = False
                    arguments[name] = default
            if complete and len(arguments) == len(plain):
                return _Bound(arguments)
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as error:
            raise ArgumentsMismatchError(
                f"{self.name}: the arguments do not match the task's signature {self.signature}: "
                f"{error}",
                param=None,
            ) from None
        bound.apply_defaults()
        return bound

    def _lookup(self, bound: _Bound | inspect.BoundArguments, field: str) -> object:
        if field in bound.arguments:
            return bound.arguments[field]
        extra = self._extra(bound)
        if field in extra:
            return extra[field]
        raise KeyDerivationError(
            f"{self.name}: key needs argument {field!r}, which this call does not pass",
            param=field,
        )

    def derive(
        self, args: Sequence[object] = (), kwargs: Mapping[str, object] | None = None
    ) -> str:
        """The lock name for one call ``task(*args, **kwargs)``."""
        bound = self._bind(args, kwargs or {})
        key = self.key
        if callable(key):
            return self._named(self._call(key, bound), f"key callable {key!r}")
        if self._format is not None:
            values = {field: self._lookup(bound, field) for field in self._fields}
            return self._named(self._format.render(values), f"key {key!r}")
        if key is None:
            selected = dict(bound.arguments)
        else:
            selected = {f: self._lookup(bound, f) for f in self._fields}
        return f"{self.name[:MAX_READABLE]}:{self._digest(selected)}"

    def fingerprint(
        self, args: Sequence[object] = (), kwargs: Mapping[str, object] | None = None
    ) -> str:
        """The task's name and every argument of one call, bound and digested: the same
        for the same call however it is written (an idempotency key's check)."""
        return self._digest(dict(self._bind(args, kwargs or {}).arguments), keyed=False)

    def argument(
        self, name: str, args: Sequence[object] = (), kwargs: Mapping[str, object] | None = None
    ) -> object:
        """The value of the task's parameter ``name`` in one call (its default if not given)."""
        return self._lookup(self._bind(args, kwargs or {}), name)

    def check_parameter(self, name: str, what: str) -> None:
        """Refuse ``name`` now unless it is one of the task's parameters (``what`` says
        which option names it)."""
        self._check_known([name], what)

    def _digest(self, selected: Mapping[str, object], *, keyed: bool = True) -> str:
        """The digest of ``selected`` arguments: the lock key's (``keyed``), or the whole
        call's for an idempotency key's check."""
        items = sorted(selected.items())
        try:
            return _digest([self.name, [[param, encode(value, param)] for param, value in items]])
        except RecursionError:
            deep = self._too_deep_to_digest(items)
            if deep is None:  # only all of them together: no one parameter to name
                raise KeyDerivationError(
                    f"{self.name}: arguments are nested too deeply to digest together: "
                    "pass flatter values, or leave some out of the key with key=[...]",
                    param=None,
                ) from None
            raise self._too_deep(deep, selected, keyed=keyed) from None

    def _too_deep_to_digest(self, items: Sequence[tuple[str, object]]) -> str | None:
        """The first parameter whose value alone cannot be digested (the encoding nests each
        level in a tagged pair, so JSON goes about twice as deep as ``encode()`` did, and
        from Python 3.12 against a C limit of its own)."""
        for param, value in items:
            try:
                _digest([self.name, [[param, encode(value, param)]]])
            except RecursionError:
                return param
        return None

    def _too_deep(
        self, param: str, selected: Mapping[str, object], *, keyed: bool
    ) -> KeyDerivationError:
        said = f"the argument {param!r} of {self.name} is nested too deeply to digest"
        others = sorted(n for n in selected if n != param and n in self._param_names)
        if not keyed:
            fix = " (an idempotency key's check digests every argument): pass a flatter value"
        elif others:
            fix = f": leave it out of the key with key={others!r} or pass a flatter value"
        else:
            fix = ": pass a flatter value, or key=<a callable> returning the lock name"
        return KeyDerivationError(said + fix, param=param)

    def _call(self, key: Callable[..., object], bound: _Bound | inspect.BoundArguments) -> object:
        # By name, so `lambda order_id, **_: ...` works whatever the call's positions were;
        # a task taking *args cannot name them, so it gets the call as bound.
        if self._var_positional and isinstance(bound, inspect.BoundArguments):
            return key(*bound.args, **bound.kwargs)  # never a _Bound: it has no *args
        named = {n: v for n, v in bound.arguments.items() if n != self._var_keyword}
        return key(**named, **self._extra(bound))

    def _extra(self, bound: _Bound | inspect.BoundArguments) -> Mapping[str, object]:
        """The call's arguments gathered by the task's ``**kwargs``, if it takes them."""
        extra = bound.arguments.get(self._var_keyword or "")
        return extra if isinstance(extra, Mapping) else {}

    def _named(self, name: object, what: str) -> str:
        if not isinstance(name, str) or not name:
            raise KeyDerivationError(
                f"{self.name}: {what} must give a non-empty str lock name, got {name!r}",
                param=None,
            )
        if ROLE_MARK in name:
            # \x1f marks a companion lock's role (a pending hold, a throttle window, a
            # slot): a name carrying one could land on another lock's companion key.
            raise KeyDerivationError(
                f"{self.name}: {what} gave the lock name {name!r}, which has the control "
                "character \\x1f; key=[...] (hashed) takes any argument value",
                param=None,
            )
        if len(name) > MAX_FORMATTED:
            # Bounded length whatever the user data; the digest keeps distinct names distinct.
            digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
            return f"{name[:64]}~{digest}"
        return name


def derive_key(
    name: str,
    func: Callable[..., object],
    args: Sequence[object] = (),
    kwargs: Mapping[str, object] | None = None,
    *,
    key: KeyOption = None,
    bound: bool = False,
) -> str:
    """One-off derivation; build a ``KeySpec`` once per task to validate up front and reuse."""
    return KeySpec(func, name=name, key=key, bound=bound).derive(args, kwargs)
