"""``WaitingRelease``: a run's release waiting to ride its result's write.

``RedisBackend`` keeps one per result key (``ByResultKey``) from the run's end until it
rides the write of its result, or until ``task_postrun`` sends it alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from ..outages import release_or_warn
from .ride_scripts import ANY_ATTACHED

if TYPE_CHECKING:
    from ..lease.redis.calls import Arg, Pipeline
    from .pushes import RidingRelease

V = TypeVar("V")


def _text(key: object) -> str:
    return key.decode() if isinstance(key, bytes) else str(key)


@dataclass(frozen=True)
class WaitingRelease:
    """``release``, to go in a pipeline of a client of the lock store's database ``db``;
    with ``attached`` (a run of a mode that attaches: its lock's attached calls' key and
    the lock's and the pipeline's databases), whether calls are attached is asked in the
    same transaction."""

    release: RidingRelease
    db: int
    attached: tuple[str, list[Arg]] | None = None

    def add(self, pipe: Pipeline) -> None:
        """Put the release first on ``pipe``, the result write's transaction."""
        self.release.add(pipe, self.db)
        if self.attached is not None:
            key, databases = self.attached
            pipe.eval(ANY_ATTACHED, 1, key, *databases)

    def read(self, replies: list[object]) -> list[object]:
        """The transaction's replies for the release (and the question) taken off the
        front of ``replies``; the rest returned."""
        self.release.read(replies[0])
        return replies[1 if self.attached is None else 2 :]

    def told(self, replies: list[object]) -> bool | None:
        """Whether the transaction's ``replies`` say calls are attached beside the lock;
        None: not asked, or not answered."""
        if self.attached is None or len(replies) < 2 or isinstance(replies[1], Exception):
            return None
        return bool(replies[1])

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
