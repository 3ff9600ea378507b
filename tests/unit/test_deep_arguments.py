"""An argument nested too deeply to digest: refused naming the parameter, and how key=
can leave it out of the lock key."""

from __future__ import annotations

import json
from typing import Any

import pytest

from celery_singleton_lock import KeyDerivationError, KeySpec, keys


def ingest(request_id: str, payload: object = None, source: str = "api") -> None: ...


def only(payload: object) -> None: ...


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


TOO_DEEP = nested(5000)


class TestTooDeep:
    def test_the_parameter_is_named_and_key_can_leave_it_out(self) -> None:
        spec = KeySpec(ingest, name="tasks.ingest")
        with pytest.raises(KeyDerivationError) as caught:
            spec.derive(("r-1", TOO_DEEP))
        assert caught.value.param == "payload"
        assert str(caught.value) == (
            "the argument 'payload' of tasks.ingest is nested too deeply to digest: leave it "
            "out of the key with key=['request_id', 'source'] or pass a flatter value"
        )

    def test_with_a_key_list_the_other_parameters_of_the_key_are_suggested(self) -> None:
        spec = KeySpec(ingest, name="tasks.ingest", key=["request_id", "payload"])
        with pytest.raises(KeyDerivationError) as caught:
            spec.derive(("r-1",), {"payload": TOO_DEEP})
        assert caught.value.param == "payload"
        assert "leave it out of the key with key=['request_id'] or" in str(caught.value)

    def test_a_task_with_no_other_parameter_is_told_to_pass_a_flatter_value(self) -> None:
        with pytest.raises(KeyDerivationError) as caught:
            KeySpec(only, name="tasks.only").derive((TOO_DEEP,))
        assert caught.value.param == "payload"
        assert "key=[" not in str(caught.value)
        assert "pass a flatter value, or key=<a callable> returning the lock name" in str(
            caught.value
        )

    def test_an_idempotency_check_says_it_digests_every_argument(self) -> None:
        spec = KeySpec(ingest, name="tasks.ingest", key=["request_id"])
        assert spec.derive(("r-1", TOO_DEEP))  # the key leaves it out
        with pytest.raises(KeyDerivationError) as caught:
            spec.fingerprint(("r-1", TOO_DEEP))
        assert caught.value.param == "payload"
        assert "an idempotency key's check digests every argument" in str(caught.value)
        assert "key=[" not in str(caught.value)

    def test_a_value_json_cannot_nest_as_deep_as_it_was_encoded_is_named_too(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The encoding wraps each level in a tagged pair: JSON goes twice as deep as the
        value, and from Python 3.12 has a depth limit of its own."""

        class Shallow(json.JSONEncoder):
            def encode(self, o: Any) -> str:
                if _depth(o) > 40:
                    raise RecursionError("maximum recursion depth exceeded while encoding")
                return super().encode(o)

        monkeypatch.setattr(keys, "_JSON", Shallow(separators=(",", ":")))
        with pytest.raises(KeyDerivationError) as caught:
            KeySpec(ingest, name="tasks.ingest").derive(("r-1", nested(30)))
        assert caught.value.param == "payload"
        assert "key=['request_id', 'source']" in str(caught.value)

    def test_a_flat_enough_value_still_digests(self) -> None:
        spec = KeySpec(ingest, name="tasks.ingest")
        assert spec.derive(("r-1", nested(50))) != spec.derive(("r-1", nested(51)))


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(item) for item in value), default=0)
    return 0
