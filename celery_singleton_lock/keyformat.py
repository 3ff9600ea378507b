"""A format-string key (``"request:{request_idx}"``): checked when the task is declared,
rendered from one call's arguments."""

from __future__ import annotations

import string
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import date, datetime, time
from decimal import Decimal

from .exceptions import ConfigurationError, KeyDerivationError

# One value of each scalar: a format spec that renders none of them is a typo, and one
# that cannot render a parameter's annotated type fails at every call.
_SAMPLES: dict[type, object] = {
    str: "x",
    int: 1,
    float: 1.0,
    Decimal: Decimal(1),
    uuid.UUID: uuid.UUID(int=0),
    datetime: datetime(2000, 1, 1),
    date: date(2000, 1, 1),
    time: time(0),
    bytes: b"x",
}
_BY_NAME = {kind.__name__: kind for kind in _SAMPLES}
# Values a format-string key may interpolate: their str() survives a round trip through JSON
# unchanged. A list's str() would not ("(1, 2)" at the sender, "[1, 2]" at the worker).
SCALARS = (*_SAMPLES, type(None))
# The standard library's conversion (!r, !s, !a) and format spec, field by field.
_FORMATTER = string.Formatter()


def _root(field: str) -> str:
    for separator in (".", "["):
        field = field.split(separator, 1)[0]
    return field


@dataclass(frozen=True)
class Field:
    """One ``{name!conversion:spec}`` of a template."""

    name: str
    conversion: str | None
    spec: str

    def render(self, value: object) -> str:
        """``value`` as the template writes it (``ValueError``/``TypeError`` if it cannot)."""
        converted = _FORMATTER.convert_field(value, self.conversion)  # !r, !s, !a or none
        return format(converted, self.spec)

    def written(self) -> str:
        conversion = f"!{self.conversion}" if self.conversion else ""
        spec = f":{self.spec}" if self.spec else ""
        return f"{{{self.name}{conversion}{spec}}}"


class FormatKey:
    """The fields a template interpolates, checked up front; its text for one call."""

    def __init__(
        self,
        task: str,
        template: str,
        params: Collection[str],
        annotations: Mapping[str, object],
    ) -> None:
        self.task, self.template = task, template
        try:
            parsed = list(string.Formatter().parse(template))
        except ValueError as error:
            raise ConfigurationError(f"{task}: bad key format {template!r}: {error}") from None
        if not template:
            raise ConfigurationError(f"{task}: key must not be an empty string")
        written = [f for _, f, _, _ in parsed if f is not None]
        if not written and template in params:
            raise ConfigurationError(
                f"{task}: key={template!r} has no {{}} so it is one constant lock name "
                f"shared by every call; did you mean key=[{template!r}] or "
                f"key='{template.removesuffix('_id')}:{{{template}}}'? (One lock for every "
                f"call on purpose: a name that is not a parameter, e.g. key='{task}', "
                "or key=lambda **_: '<name>')"
            )
        nested = [
            f"{{{f}}}"
            for _, f, spec, _ in parsed
            if f is not None and (_root(f) != f or "{" in (spec or ""))
        ]
        if nested:
            raise ConfigurationError(
                f"{task}: key {template!r} uses attribute access, indexing or nested "
                f"fields ({', '.join(nested)}); a format key interpolates whole parameters. "
                "Use a callable for more, e.g. key=lambda order, **_: f'order:{order[\"id\"]}'"
            )
        if [f for f in written if f == "" or f.isdigit()]:
            raise ConfigurationError(
                f"{task}: key {template!r} uses positional fields; name the parameters, "
                "e.g. 'request:{request_idx}'"
            )
        self.fields: tuple[Field, ...] = tuple(
            Field(f, conversion, spec or "")
            for _, f, spec, conversion in parsed
            if f is not None and (spec or conversion)
        )
        self.names = tuple(dict.fromkeys(written))
        for field in self.fields:
            self._check_spec(field, annotations.get(field.name))

    def _check_spec(self, field: Field, annotation: object) -> None:
        """Refuse a spec no value of the parameter's type (else of any scalar) renders."""
        # Under ``from __future__ import annotations`` the annotation is its source text.
        typed = _BY_NAME.get(annotation) if isinstance(annotation, str) else annotation
        sample = _SAMPLES.get(typed) if isinstance(typed, type) else None
        samples = list(_SAMPLES.values()) if sample is None else [sample]
        last: Exception | None = None
        for each in samples:
            try:
                field.render(each)
            except (ValueError, TypeError) as error:
                last = error
            else:
                return
        what = "any argument" if sample is None else f"its {type(sample).__name__} argument"
        raise ConfigurationError(
            f"{self.task}: key {self.template!r} writes {field.written()}, which cannot "
            f"render {what} ({last}); fix the format spec, or use a callable key"
        )

    def render(self, values: Mapping[str, object]) -> str:
        """The template filled with one call's arguments (``KeyDerivationError`` naming
        the field and the value that do not fit)."""
        for name, value in values.items():
            if not isinstance(value, SCALARS):
                raise KeyDerivationError(
                    f"{self.task}: key {self.template!r} interpolates {name!r}, a "
                    f"{type(value).__name__}; a format key takes scalar arguments (str, int, "
                    "UUID, ...). Use key=[...] or a callable for containers",
                    param=name,
                )
        try:
            return self.template.format_map(values)
        except (ValueError, TypeError) as error:
            for field in self.fields:
                value = values.get(field.name)
                try:
                    field.render(value)
                except (ValueError, TypeError):
                    raise KeyDerivationError(
                        f"{self.task}: key {self.template!r} cannot write {field.name}="
                        f"{value!r} as {field.written()} ({error}); pass a value that "
                        "format spec takes, or use a callable key",
                        param=field.name,
                    ) from None
            raise KeyDerivationError(
                f"{self.task}: key {self.template!r}: {error}", param=None
            ) from None
