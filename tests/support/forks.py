"""What a check says when run in a forked child of the test process."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable


def in_forked_child(check: Callable[[], bool]) -> bool:
    """Fork, run ``check`` in the child (its exceptions count as False), and return its
    answer; the child exits without running the parent's cleanup."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            ok = False
            try:
                ok = bool(check())
            finally:
                os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    return answer == b"1"
