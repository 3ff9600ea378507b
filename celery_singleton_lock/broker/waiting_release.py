"""``WaitingRelease``: a run's release waiting to ride its result's write.

``RedisBackend`` keeps one per result key (``ByResultKey``) from the run's end until it
rides the write of its result, or until ``task_postrun`` sends it alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from ..outages import release_or_warn

if TYPE_CHECKING:
    from ..lease.redis.calls import Pipeline
    from .pushes import RidingRelease

V = TypeVar("V")


def _text(key: object) -> str:
    return key.decode() if isinstance(key, bytes) else str(key)


@dataclass(frozen=True)
class WaitingRelease:
    """``release``, to go in a pipeline of a client of the lock store's database ``db``."""

    release: RidingRelease
    db: int

    def add(self, pipe: Pipeline) -> None:
        """Put the release first on ``pipe``, the result write's transaction."""
        self.release.add(pipe, self.db)

    def read(self, reply: object) -> None:
        """The transaction's reply for the release."""
        self.release.read(reply)

    def unsent(self, error: BaseException) -> bool:
        """The transaction failed before an answer: True if the release is to go alone
        (``RidingRelease.unsent``), False if it may ride the write's next try."""
        return self.release.unsent(error)

    def alone(self) -> None:
        """Sent on a round trip of its own (it rides no write); a failure only warns."""
        release = self.release
        release_or_warn(lambda _: release.alone(), release.lease)


class ByResultKey(Generic[V]):
    """A value per result key, the key as Celery makes it (bytes) or as text alike."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: dict[str, V] = {}

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, key: object) -> bool:
        return _text(key) in self._values

    def __setitem__(self, key: object, value: V) -> None:
        self._values[_text(key)] = value

    def get(self, key: object) -> V | None:
        return self._values.get(_text(key))

    def pop(self, key: object) -> V | None:
        return self._values.pop(_text(key), None)
