"""Options that cannot go together are one table (``config.contradictions``): each row is
reached by some options, says what to write instead, and the first that applies is said."""

from __future__ import annotations

import re

import pytest

from celery_singleton_lock import ConfigurationError
from celery_singleton_lock.config.contradictions import CONTRADICTIONS
from celery_singleton_lock.config.options import SingletonOptions

from ..support.workers import ROOT


def job(order_id: int) -> None: ...


# One set of options per row, in the table's order, with how its message starts.
EACH_ROW = [
    ({"limit": 2, "throttle": 5}, "limit=2 with throttle: "),
    ({"burst": 2}, "burst without rate: "),
    ({"rate": "10/m", "on_duplicate": "raise"}, "rate with on_duplicate: "),
    ({"max_wait": 5}, "max_wait without debounce: "),
    ({"debounce": 5, "max_wait": 1}, "max_wait=1 is below debounce=5: "),
    ({"debounce": 5, "throttle": 5}, "debounce with throttle: "),
    ({"lock": "until_executed", "dedupe": False}, "lock='until_executed' with dedupe=False "),
    ({"throttle": 5, "lock": "until_executed"}, "throttle with lock='until_executed': "),
    ({"dedupe": False, "on_duplicate": "raise"}, "on_duplicate='raise' with dedupe=False: "),
    ({"terminate_on_cancel": True}, "terminate_on_cancel without on_duplicate='cancel': "),
    ({"on_duplicate": "cancel", "throttle": 5}, "on_duplicate='cancel' with throttle: "),
    (
        {"on_duplicate": "replace", "lock": "while_executing"},
        "on_duplicate='replace' with lock='while_executing': ",
    ),
    ({"total_limit": 3}, "total_limit=3 without limit: "),
    ({"limit": 2, "weight": 3}, "total_order= and weight= say how a total_limit's "),
    ({"reopen_on": "failure", "lock": "until_executing"}, "reopen_on='failure' applies to "),
    ({"max_pending": 3}, "max_pending=3 with lock='until_executed': "),
    (
        {"idempotency": True, "on_duplicate": "replace"},
        "idempotency cannot be used with on_duplicate='replace': ",
    ),
]
# Words a message uses to say what to write instead.
INSTEAD = ("drop", "write", "use", "add", "make")


def refusal(options: dict[str, object]) -> str:
    with pytest.raises(ConfigurationError) as raised:
        SingletonOptions.build("t", job, options)
    return str(raised.value)


class TestTheTable:
    def test_every_row_has_options_that_reach_it(self) -> None:
        assert len(EACH_ROW) == len(CONTRADICTIONS)

    @pytest.mark.parametrize(("options", "start"), EACH_ROW)
    def test_a_row_refuses_its_options_saying_what_to_write_instead(
        self, options: dict[str, object], start: str
    ) -> None:
        message = refusal(options)
        assert message.startswith(f"t: {start}")
        assert any(word in message for word in INSTEAD)

    def test_the_first_row_that_applies_is_said(self) -> None:
        message = refusal({"limit": 2, "throttle": 5, "total_limit": 3, "max_wait": 1})
        assert message.startswith("t: limit=2 with throttle: ")

    def test_a_bad_value_of_one_option_is_said_where_it_is_read(self) -> None:
        assert refusal({"max_pending": 0}) == "t: max_pending must be an int >= 1, got 0"

    def test_options_that_go_together_pass(self) -> None:
        options = SingletonOptions.build("t", job, {"limit": 2, "total_limit": 3})
        assert (options.limit, options.total_limit) == (2, 3)


class TestTheDocs:
    def test_the_modes_page_lists_the_table_row_for_row(self) -> None:
        """docs/modes.md's "### Contradictions" says the table once: one item a row, in
        the table's order, as the row's ``listed`` says it."""
        page = (ROOT / "docs" / "modes.md").read_text()
        section = page.split("### Contradictions\n", 1)[1].split("\n#", 1)[0]
        items = re.findall(r"^- (.+)$", section, re.M)
        assert items == [row.listed for row in CONTRADICTIONS]
