"""Every error pickles with its context: Celery ships exceptions between processes."""

from __future__ import annotations

import pickle

import pytest

from celery_singleton_lock import (
    ConfigurationError,
    DuplicateTaskError,
    KeyDerivationError,
    LockLostError,
    LockNotAcquiredError,
    LockStoreUnavailableError,
    RateLimitedError,
    SingletonLockError,
    TaskCancelledError,
)

ERRORS = [
    SingletonLockError("base", key="k"),
    ConfigurationError("bad ttl"),
    KeyDerivationError("cannot encode", key=None, param="order_id"),
    LockNotAcquiredError("held", key="p:{k}", holder="tok", retry_after=1.5),
    LockLostError("lost", key="p:{k}", reason="it expired"),
    DuplicateTaskError("dup", key="p:{k}", task_id="abc-123"),
    LockStoreUnavailableError("down", key="p:{k}", url="redis://***@h:6379/0"),
    RateLimitedError("over its rate", name="t:k", retry_after=0.25),
    TaskCancelledError("cancelled", key="p:{k}", reason="a newer call is waiting for its key"),
]


class TestErrors:
    @pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
    def test_round_trips_through_pickle_with_its_context(self, error: SingletonLockError) -> None:
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert str(copy) == str(error)
        assert copy.key == error.key
        assert copy.__dict__ == error.__dict__

    def test_bad_input_errors_are_value_errors(self) -> None:
        assert issubclass(ConfigurationError, ValueError)
        assert issubclass(KeyDerivationError, ValueError)

    def test_all_share_one_base(self) -> None:
        assert all(isinstance(e, SingletonLockError) for e in ERRORS)
