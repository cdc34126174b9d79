"""Server-side paging and filtering of the admin API's lists (nodes, models).

A fleet of 10,000 nodes is a 40 MB answer when listed whole; a client asks for
a page instead. Every list is ordered by its key (a node's id, a model's name),
and a page is `limit` items after the key `after` (the previous page's
`next_after`), so a client walks the list without skipping or repeating an item
even while nodes come and go. Filters apply before paging:

    ?limit=N          at most N items (1 to MAX_LIMIT); without it, every match
    ?after=KEY        only items whose key sorts after KEY
    ?state=S          nodes in state S (ready, unreachable, lost, draining)
    ?q=WORDS          items whose words (id, host name, state, labels as k=v)
                      contain every word, case-insensitively

The answer carries `total` (how many match the filters) and `next_after` (the
key to ask after for the next page; null on the last). A bad parameter is a
400 naming it.

Not guaranteed: a consistent snapshot across pages; each page is read when it
is asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

MAX_LIMIT = 1000
MAX_QUERY_CHARS = 200

T = TypeVar("T")


class BadPageQuery(ValueError):
    """A paging or filter parameter that cannot be used; `param` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class PageQuery:
    limit: int | None = None
    after: str | None = None
    state: str | None = None
    words: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[T]
    total: int
    next_after: str | None


def page_query(params: Mapping[str, str], *, states: Collection[str] = ()) -> PageQuery:
    """Read `limit`, `after`, `state` (one of `states`; none allowed when empty) and `q`."""
    limit = None
    raw = params.get("limit")
    if raw is not None:
        try:
            limit = int(raw)
        except ValueError:
            raise BadPageQuery("limit", f"limit must be a whole number, got {raw!r}") from None
        if not 1 <= limit <= MAX_LIMIT:
            raise BadPageQuery(
                "limit", f"limit must be between 1 and {MAX_LIMIT}, got {limit}; page with after"
            )
    state = params.get("state")
    if state is not None and state not in states:
        allowed = ", ".join(sorted(states)) or "none"
        raise BadPageQuery("state", f"state must be one of {allowed}, got {state!r}")
    q = params.get("q") or ""
    if len(q) > MAX_QUERY_CHARS:
        raise BadPageQuery("q", f"q is longer than {MAX_QUERY_CHARS} characters")
    return PageQuery(
        limit=limit,
        after=params.get("after") or None,
        state=state,
        words=tuple(q.lower().split()),
    )


def words_of(*parts: object, labels: Iterable[Mapping[str, str] | None] = ()) -> str:
    """What `?q=` searches: the parts and every label as k=v, lower case."""
    pairs = [f"{k}={v}" for group in labels for k, v in (group or {}).items()]
    return " ".join([*(str(p) for p in parts), *pairs]).lower()


def take_page(
    items: Iterable[T],
    *,
    key: Callable[[T], str],
    query: PageQuery,
    matches: Callable[[T], bool] = lambda _: True,
) -> Page[T]:
    """The page of `items` (in any order) that `query` asks for; `matches` filters."""
    chosen: Sequence[T] = sorted((i for i in items if matches(i)), key=key)
    total = len(chosen)
    if query.after is not None:
        after = query.after
        chosen = [i for i in chosen if key(i) > after]
    if query.limit is None or len(chosen) <= query.limit:
        return Page(list(chosen), total, None)
    shown = list(chosen[: query.limit])
    return Page(shown, total, key(shown[-1]))
