"""One word, one meaning (docs/design.md, "Words"): the words retired for another meaning
stay out of the package's code, comments, docstrings and Lua.

A hold is a lock a call takes for its message, so a paused run is not "held back"; a ride
is a lock operation in a round trip Celery makes anyway, so it is not carried, a trip, a
seam or a rider; pending is a call not started yet, so a reply not read yet is unread.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

import celery_singleton_lock

PACKAGE = Path(celery_singleton_lock.__file__).parent

# Files whose renames another change applies after the merge (publish/, config/, modes/,
# the face, the result backend): each leaves this list as its renames land.
NOT_YET: tuple[str, ...] = ()

# Retired words in prose and Lua, matched across line breaks and comment markers.
RETIRED_TEXT = {
    "rider": re.compile(r"\briders?\b", re.IGNORECASE),
    "seam": re.compile(r"\bseams?\b", re.IGNORECASE),
    "piggyback": re.compile(r"piggyback", re.IGNORECASE),
    "trip": re.compile(r"(?<!round )\btrips?\b", re.IGNORECASE),
    "held back": re.compile(
        r"\bheld[-_ ]back\b|(?<!its )(?<!the )\bhold[-_ ]back\b"
        r"|\bholds? (it|them|this run|runs|calls) back\b",
        re.IGNORECASE,
    ),
    "hold up": re.compile(r"\bhold(s|ing)? up\b", re.IGNORECASE),
    # A worker has (receives, keeps) a message; a token holds a lock.
    "holds a message": re.compile(
        r"\bhold(s|ing) (an? |the |its )?(ETA )?messages?\b", re.IGNORECASE
    ),
    # An acquire sent and not read is unread: pending is a call not started yet.
    "pending acquire": re.compile(
        r"\bpending\b\s*(=\s*[\w.]*begin_try_acquire\b|:\s*PendingAcquire\b)"
    ),
}
# In broker/ "carry" meant ride; elsewhere it is plain English (a message carries a header).
RETIRED_IN_BROKER = {"carry": re.compile(r"\bcarr(y|ies|ied|ying)\b", re.IGNORECASE)}
# Retired Python names (identifiers, attributes, parameters). A name ``pending`` is for
# the pending call (``Replace(pending=True)``: its hold is the pending companion).
RETIRED_NAMES = frozenset({
    "_pending",
    "Pending",
    "Rider",
    "rider",
    "riders",
    "LockTrips",
    "OwnTrips",
    "OWN_TRIPS",
    "trips_of",
    "carried",
    "carries",
    "held_back",
    "hold_back",
    "HELD_HEADER",
})  # fmt: skip

# Text that still says a retired word on purpose, by file: what tests or users read
# (a log line, an Ignore reason, CLI help), or a name defined in a NOT_YET file.
KEPT = {
    "run/resend.py": ('"%s[%s] held back %.2fs', 'f"held back: '),  # grepped by tests
    "run/admission.py": ("mode.waits_out_pause(",),  # modes.base.Mode.waits_out_pause
    "contrib/limits_command.py": ("(held back, never dropped)", "Let held-back calls go"),
    "contrib/cli_base.py": ("(held back; --resume lets go)",),
    "worker/reservations.py": ("from ..broker.ride import lock_ride", "lock_ride(app)"),
    "worker/receipts.py": ("(``broker.ride``)",),
}


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix() if path.is_relative_to(PACKAGE) else path.name


SOURCES = sorted(
    path
    for path in PACKAGE.rglob("*")
    if path.suffix in (".py", ".lua", ".html")
    and not _relative(path).startswith(NOT_YET)
    and "__pycache__" not in path.parts
)


def _prose(path: Path) -> str:
    """The file's text with what it keeps on purpose left out, one line: a phrase broken
    over two lines of a comment or docstring is found too."""
    text = path.read_text()
    for kept in KEPT.get(_relative(path), ()):
        text = text.replace(kept, "")
    return re.sub(r"[ \t]*\n[ \t]*(?:#|--)?[ \t]*", " ", text)


def _names(path: Path) -> set[str]:
    """The Python names ``path`` writes, but those in the text it keeps on purpose."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    names = {token.string for token in tokens if token.type == tokenize.NAME}
    kept = " ".join(KEPT.get(_relative(path), ()))
    return names - set(re.findall(r"\w+", kept))


def _found(path: Path) -> list[str]:
    text = _prose(path)
    rules = dict(RETIRED_TEXT)
    if _relative(path).startswith("broker/"):
        rules.update(RETIRED_IN_BROKER)
    found = [
        f"{word}: ...{text[max(0, m.start() - 40) : m.end() + 20]}..."
        for word, rule in rules.items()
        for m in rule.finditer(text)
    ]
    if path.suffix == ".py":
        found += [f"name {name}" for name in sorted(_names(path) & RETIRED_NAMES)]
    return found


class TestRetiredWords:
    def test_there_are_sources_to_check(self) -> None:
        assert len([p for p in SOURCES if p.suffix == ".py"]) >= 80
        assert len([p for p in SOURCES if p.suffix == ".lua"]) >= 20

    @pytest.mark.parametrize("path", SOURCES, ids=_relative)
    def test_no_retired_word_is_back(self, path: Path) -> None:
        assert _found(path) == []

    @pytest.mark.parametrize(
        ("name", "kept"),
        [(name, kept) for name, texts in KEPT.items() for kept in texts],
    )
    def test_each_kept_text_is_still_there(self, name: str, kept: str) -> None:
        """A kept text that went (its rename applied) leaves ``KEPT`` too."""
        assert kept in (PACKAGE / name).read_text()

    def test_each_file_left_for_later_exists(self) -> None:
        for left in NOT_YET:
            assert (PACKAGE / left).exists(), left

    def test_a_retired_word_is_found_across_a_line_break(self, tmp_path: Path) -> None:
        source = tmp_path / "sample.py"
        source.write_text(
            "# a run a pause held\n"
            "# back, its riders, the\n"
            "# a worker holding the message\n"
            '"""piggybacked; one trip\n'
            '    of its own, or its round trip."""\n'
            "_pending = riders = 1\n"
            "pending = store.begin_try_acquire(name, 1)\n"
        )
        text = _prose(source)
        assert {word for word, rule in RETIRED_TEXT.items() if rule.search(text)} == {
            "held back",
            "rider",
            "piggyback",
            "trip",
            "pending acquire",
            "holds a message",
        }
        assert len(RETIRED_TEXT["trip"].findall(text)) == 1  # "round trip" is the word
        assert {"_pending", "riders"} <= _names(source) & RETIRED_NAMES

    def test_plain_words_are_not_retired(self) -> None:
        for plain in (
            "a message carries its key",
            "its hold given back",
            "hands its hold back",
            "one round trip",
            "the pending call's hold",
            "Replace(pending=True)",
            "the workers holding a running lease",
            "as this worker holds it",
            "the message's own hold\nThe message's own hold",
        ):
            assert not any(rule.search(plain) for rule in RETIRED_TEXT.values()), plain
