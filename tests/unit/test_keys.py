"""Key derivation: canonical, type-tagged, signature-bound, equal as sender and worker see it."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kombu.utils import json as kombu_json

from celery_singleton_lock import ConfigurationError, KeyDerivationError, KeySpec, derive_key


def charge(order_id: int, amount: float = 1.0, currency: str = "EUR") -> None: ...


def anything(*args: Any, **kwargs: Any) -> None: ...


def process_request(request_idx: int, attempt: int = 0) -> None: ...


def callback_request(request_idx: int, url: str = "") -> None: ...


def wire(value: object) -> Any:
    """What a worker sees after Celery's JSON serializer carried ``value``."""
    return kombu_json.loads(kombu_json.dumps(value))


scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.uuids()
    | st.datetimes(timezones=st.none() | st.just(UTC))
    | st.dates()
    | st.times()
    | st.decimals(allow_nan=False, allow_infinity=False)
    | st.binary(max_size=20)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)


class TestCanonical:
    @given(values)
    def test_sender_and_worker_derive_the_same_key(self, value: object) -> None:
        sent = derive_key("t", anything, (value,), {"k": value})
        received = derive_key("t", anything, wire((value,)), wire({"k": value}))
        assert sent == received

    @given(values, values)
    def test_keys_are_equal_exactly_when_the_wire_form_is(self, a: object, b: object) -> None:
        same_wire = json.dumps(wire(a), sort_keys=True, default=repr) == json.dumps(
            wire(b), sort_keys=True, default=repr
        ) and type_shape(wire(a)) == type_shape(wire(b))
        same_key = derive_key("t", anything, (a,)) == derive_key("t", anything, (b,))
        assert same_key == same_wire

    @pytest.mark.parametrize(
        ("a", "b"),
        [
            (7, "7"),
            (1, 1.0),
            (True, 1),
            (None, "None"),
            ("a,b", ["a", "b"]),
            (["a:b"], ["a", "b"]),
            ({"a": 1}, [["a", 1]]),
            (b"ab", "ab"),
            (Decimal("1.0"), 1.0),
            (uuid.UUID(int=1), str(uuid.UUID(int=1))),
            (date(2026, 1, 1), "2026-01-01"),
            (-0.0, 0.0),
        ],
    )
    def test_different_values_never_collide(self, a: object, b: object) -> None:
        assert derive_key("t", anything, (a,)) != derive_key("t", anything, (b,))

    def test_tuple_and_list_are_one_key_as_json_makes_them(self) -> None:
        assert derive_key("t", anything, ((1, 2),)) == derive_key("t", anything, ([1, 2],))

    def test_dict_order_never_matters(self) -> None:
        assert derive_key("t", anything, ({"a": 1, "b": 2},)) == derive_key(
            "t", anything, ({"b": 2, "a": 1},)
        )

    def test_keys_have_a_readable_prefix_and_fixed_length(self) -> None:
        small = derive_key("orders.charge", charge, (1,))
        huge = derive_key("orders.charge", charge, ("x" * 1_000_000,))
        assert small.startswith("orders.charge:")
        assert len(small) == len(huge) == len("orders.charge:") + 64

    def test_task_name_is_part_of_the_key(self) -> None:
        assert derive_key("a", charge, (1,)) != derive_key("b", charge, (1,))


def type_shape(value: object) -> object:
    """Types as well as values: JSON text alone equates 1 and True in some spellings."""
    if isinstance(value, list):
        return [type_shape(v) for v in value]
    if isinstance(value, dict):
        return {k: type_shape(v) for k, v in value.items()}
    return type(value).__name__


class TestBinding:
    @pytest.mark.parametrize(
        ("args", "kwargs"),
        [
            ((5,), {}),
            ((), {"order_id": 5}),
            ((5, 1.0), {}),
            ((5,), {"currency": "EUR", "amount": 1.0}),
            ((), {"currency": "EUR", "order_id": 5}),
        ],
    )
    def test_defaults_and_keyword_order_give_one_key(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        assert derive_key("charge", charge, args, kwargs) == derive_key("charge", charge, (5,))

    def test_a_non_default_value_is_a_different_key(self) -> None:
        assert derive_key("charge", charge, (5,), {"amount": 2.0}) != derive_key(
            "charge", charge, (5,)
        )

    def test_bound_tasks_skip_self(self) -> None:
        def bound(self: object, order_id: int) -> None: ...

        spec = KeySpec(bound, name="t", key=["order_id"], bound=True)
        assert spec.derive((5,)) == spec.derive((), {"order_id": 5})

    def test_arguments_not_matching_the_signature_are_refused(self) -> None:
        with pytest.raises(KeyDerivationError, match="do not match the task's signature"):
            derive_key("charge", charge, (1, 2, 3, 4))


class TestSubsets:
    def test_named_parameters_ignore_the_others(self) -> None:
        spec = KeySpec(charge, name="charge", key=["order_id"])
        assert spec.derive((5, 9.0)) == spec.derive((5,), {"currency": "USD"})
        assert spec.derive((5,)) != spec.derive((6,))

    def test_unknown_parameter_names_are_refused_when_the_spec_is_built(self) -> None:
        with pytest.raises(ConfigurationError, match=r"\['order'\].*parameters are"):
            KeySpec(charge, name="charge", key=["order"])

    def test_names_from_var_keyword_are_allowed_and_looked_up(self) -> None:
        spec = KeySpec(anything, name="t", key=["tenant"])
        assert spec.derive((), {"tenant": 1, "x": 2}) == spec.derive((), {"tenant": 1})
        with pytest.raises(KeyDerivationError, match="does not pass"):
            spec.derive((), {"x": 2})

    def test_format_string_names_a_lock_shared_across_tasks(self) -> None:
        process = KeySpec(process_request, name="process", key="request:{request_idx}")
        callback = KeySpec(callback_request, name="callback", key="request:{request_idx}")
        assert process.derive((7,)) == callback.derive((7,), {"url": "x"}) == "request:7"

    def test_format_string_fields_are_checked_when_the_spec_is_built(self) -> None:
        with pytest.raises(ConfigurationError, match="not parameters"):
            KeySpec(process_request, name="p", key="request:{request}")
        with pytest.raises(ConfigurationError, match="positional fields"):
            KeySpec(process_request, name="p", key="request:{}")
        with pytest.raises(ConfigurationError, match="bad key format"):
            KeySpec(process_request, name="p", key="request:{request_idx")

    def test_format_string_refuses_containers(self) -> None:
        spec = KeySpec(process_request, name="p", key="request:{request_idx}")
        with pytest.raises(KeyDerivationError, match="scalar") as caught:
            spec.derive(([1, 2],))
        assert caught.value.param == "request_idx"

    def test_a_format_spec_is_checked_against_the_parameter_s_type(self) -> None:
        def dated(when: datetime, n: int) -> None: ...

        assert KeySpec(dated, name="d", key="run:{when:%Y}").derive((datetime(2024, 5, 1), 1)) == (
            "run:2024"
        )
        assert KeySpec(dated, name="d", key="n:{n:05d}").derive((None, 7)) == "n:00007"
        # An int never renders as %Y: said when the task is declared.
        with pytest.raises(
            ConfigurationError, match=r"writes \{n:%Y\}, which cannot render its int"
        ):
            KeySpec(dated, name="d", key="n:{n:%Y}")

    def test_a_value_its_format_spec_cannot_write_names_the_key_and_the_value(self) -> None:
        spec = KeySpec(anything, name="a", key="run:{when:%Y}")
        with pytest.raises(
            KeyDerivationError, match=r"cannot write when=5 as \{when:%Y\}"
        ) as caught:
            spec.derive((), {"when": 5})
        assert caught.value.param == "when"

    def test_format_string_with_huge_values_stays_short(self) -> None:
        spec = KeySpec(process_request, name="p", key="request:{request_idx}")
        key = spec.derive(("x" * 10_000,))
        assert len(key) == 64 + 1 + 64
        assert key != spec.derive(("x" * 9_999 + "y",))

    def test_callable_returns_the_lock_name(self) -> None:
        spec = KeySpec(charge, name="charge", key=lambda order_id, **_: f"order:{order_id}")
        assert spec.derive((5,)) == "order:5"
        bad = KeySpec(charge, name="charge", key=lambda order_id, **_: order_id)
        with pytest.raises(KeyDerivationError, match="non-empty str"):
            bad.derive((5,))

    @pytest.mark.parametrize("key", [5, [1], object(), ""])
    def test_bad_key_option_is_refused(self, key: object) -> None:
        with pytest.raises(ConfigurationError):
            KeySpec(charge, name="charge", key=key)  # type: ignore[arg-type]


class TestUnencodable:
    def test_unencodable_argument_names_the_parameter_and_its_type(self) -> None:
        with pytest.raises(KeyDerivationError) as caught:
            derive_key("charge", charge, (object(),))
        assert caught.value.param == "order_id"
        assert "builtins.object" in str(caught.value)
        assert "pass key=" in str(caught.value)

    def test_nested_unencodable_value_names_its_path(self) -> None:
        with pytest.raises(KeyDerivationError) as caught:
            derive_key("t", anything, ([1, {"a": {1, 2}}],))
        assert caught.value.param == "args[0][1]['a']"

    @pytest.mark.parametrize("value", [{1, 2}, frozenset(), timedelta(1), 1j, bytearray(b"x")])
    def test_types_celery_json_cannot_carry_are_refused(self, value: object) -> None:
        with pytest.raises(KeyDerivationError, match="no canonical encoding"):
            derive_key("t", anything, (value,))

    def test_dict_keys_json_cannot_carry_are_refused(self) -> None:
        with pytest.raises(KeyDerivationError, match="dict key"):
            derive_key("t", anything, ({(1, 2): "x"},))

    def test_dict_keys_are_strings_as_json_makes_them(self) -> None:
        assert derive_key("t", anything, ({1: "x"},)) == derive_key("t", anything, ({"1": "x"},))


def test_scalar_round_trips_used_above_really_are_what_kombu_does() -> None:
    assert wire((1, 2)) == [1, 2]
    assert wire({1: "x"}) == {"1": "x"}
    assert isinstance(wire(uuid.UUID(int=3)), uuid.UUID)
    assert isinstance(wire(datetime(2026, 1, 1)), datetime)
    assert isinstance(wire(time(1, 2)), time)
    assert wire(b"\xff") == b"\xff"
