"""One page of the app's locks, filtered and sorted by age, read in one streamed pass.

The store is read a batch at a time (``LockStore.holdings``: SCAN, never KEYS) and only the
rows of the page asked for are kept: memory is bounded by the page, whatever the number of
locks.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal
from urllib.parse import urlencode

from ..locks import HOLDING, STATES, LockRow

# The list's states: the store's, and the locks whose holder is gone (asked of the workers
# and the broker, as ``celery singleton orphans`` does).
PAGE_STATES = (*STATES, "orphaned")
ORPHAN_STATES = HOLDING

SORTS = ("oldest", "newest")
PER_PAGE = 50
MAX_PER_PAGE = 500
# Deep pages cost memory (the rows before them are ranked too): as deep as this.
MAX_RANKED = 20_000


@dataclass(frozen=True)
class Query:
    """What the list shows: filters, order and page (from a request's query string)."""

    task: str = ""
    state: str = ""
    search: str = ""  # a part of the lock's name or key, or a task id
    sort: Literal["oldest", "newest"] = "oldest"
    page: int = 1
    per: int = PER_PAGE

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> Query:
        """Tolerant: a value that makes no sense is left at its default."""
        sort = params.get("sort", "oldest")
        return cls(
            task=params.get("task", "").strip(),
            state=params.get("state", "") if params.get("state", "") in PAGE_STATES else "",
            search=params.get("q", "").strip(),
            sort="newest" if sort == "newest" else "oldest",
            page=_number(params.get("page"), 1, MAX_RANKED),
            per=_number(params.get("per"), PER_PAGE, MAX_PER_PAGE),
        )

    def params(self, **changes: object) -> str:
        """The query string of this query with ``changes`` (defaults left out)."""
        query = replace(self, **changes)  # type: ignore[arg-type]
        pairs = {
            "task": query.task,
            "state": query.state,
            "q": query.search,
            "sort": "" if query.sort == "oldest" else query.sort,
            "page": "" if query.page == 1 else str(query.page),
            "per": "" if query.per == PER_PAGE else str(query.per),
        }
        return urlencode({name: value for name, value in pairs.items() if value})

    def wants(self, row: LockRow) -> bool:
        """Whether ``row`` passes the filters other than its state."""
        if self.task and row.task != self.task:
            return False
        search = self.search.lower()
        return not search or any(
            search in (text or "").lower() for text in (row.name, row.key, row.task_id)
        )


@dataclass(frozen=True)
class Page:
    rows: list[LockRow]
    total: int  # locks that pass every filter
    counts: dict[str, int]  # per state, of the locks that pass the other filters
    pages: int
    query: Query
    capped: bool  # the page asked for is deeper than the ranking goes


def page_of(rows: Iterable[LockRow], query: Query) -> Page:
    """The page ``query`` asks for, in one pass over ``rows``: a heap of ``page * per``
    rows at most is kept, with counts per state of every lock that passed the other
    filters."""
    counts: dict[str, int] = {}
    total = 0
    keep = min(query.page * query.per, MAX_RANKED)
    # The heap's root is the worst row kept: (score, -seen), higher is better (older
    # first, or newer first; a hold of unknown age last; then in the order read).
    ranked: list[tuple[float, int, LockRow]] = []
    for seen, row in enumerate(rows):
        if not query.wants(row):
            continue
        counts[row.state] = counts.get(row.state, 0) + 1
        if query.state and row.state != query.state:
            continue
        total += 1
        if row.age is None:
            score = float("-inf")
        else:
            score = row.age if query.sort == "oldest" else -row.age
        entry = (score, -seen, row)
        if len(ranked) < keep:
            heapq.heappush(ranked, entry)
        elif entry[:2] > ranked[0][:2]:
            heapq.heapreplace(ranked, entry)
    ordered = [row for _, _, row in sorted(ranked, reverse=True)]
    start = (query.page - 1) * query.per
    pages = max(1, -(-total // query.per))
    return Page(
        rows=ordered[start : start + query.per],
        total=total,
        counts=counts,
        pages=pages,
        query=query,
        capped=query.page * query.per > MAX_RANKED,
    )


def _number(text: str | None, default: int, most: int) -> int:
    try:
        value = int(text or "")
    except ValueError:
        return default
    return min(max(1, value), most)
