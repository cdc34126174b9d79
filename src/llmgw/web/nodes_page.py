"""The nodes page: a text filter, each node's card with its GPU rows folded, and
refreshes that replace only the cards that changed.

A fleet of 100 nodes is a page of 800 GPU rows; redrawing all of it every few
seconds kept the browser busy (hundreds of ms in Chromium per refresh). So:

- `filter_nodes` keeps the nodes whose id, host name, state, labels or fabric
  labels contain every word of the filter (case-insensitive; `zone=a` matches
  a label), so a person finds a node among hundreds.
- Each card is rendered on its own and carries a version (a hash of its HTML)
  in a hidden input; so does the summary above the cards (state counts, how
  many match). The page's refresh sends those versions back (`v=ID VERSION`),
  and `node_changes` answers with only what differs, as htmx out-of-band swaps:
  a changed card replaced, a new one appended, a gone one deleted; nothing at
  all (None: the handler answers 204) when nothing changed.
- A page shows at most `PAGE_SIZE` cards (in id order, `?page=N`), with links
  to the pages before and after: a fleet of 10,000 nodes is 100 pages, not
  10,000 cards; the summary counts every node that matches.
- A card shows what a person acts on, not what moves on every heartbeat: the
  heartbeat's time only when the node is not ready. GPU memory and
  utilization still change a card when they move.

Not guaranteed: the order of cards added by a refresh (they are appended; a
reload sorts them again), or that a refresh sees a filter typed since the
page's last load (the filter replaces the whole list when it changes).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from markupsafe import Markup

from llmgw.web.render import Renderer
from llmgw.web.views import NODE_STATES, node_cards, ordered_counts

Json = dict[str, Any]
SUMMARY_ID = "#summary"
# The longest filter kept (a search box, not a query language).
MAX_FILTER_CHARS = 200
# Cards per page: enough to scan, few enough to render and refresh quickly.
PAGE_SIZE = 100


@dataclass(frozen=True, slots=True)
class Part:
    """A rendered card (or the summary) and the version a refresh compares."""

    id: str
    html: Markup
    version: str


def _words(node: Json) -> str:
    labels = [f"{k}={v}" for k, v in (node.get("labels") or {}).items()]
    fabric = [f"{k}={v}" for k, v in (node.get("fabric") or {}).items()]
    states = [str(node.get("state", ""))] + (["draining"] if node.get("draining") else [])
    return " ".join(
        [str(node.get("id", "")), str(node.get("hostname", "")), *states, *labels, *fabric]
    ).lower()


def clean_filter(text: str | None) -> str:
    """The filter as typed, trimmed and cut to `MAX_FILTER_CHARS`."""
    return " ".join((text or "").split())[:MAX_FILTER_CHARS]


def clean_page(text: str | None) -> int:
    """The page asked for (1 for a missing or unreadable one; pages count from 1)."""
    try:
        return max(1, int(text or "1"))
    except ValueError:
        return 1


def filter_nodes(nodes: Iterable[Json], q: str) -> list[Json]:
    """The nodes whose words contain every word of `q` (all of them for an empty `q`)."""
    wanted = q.lower().split()
    return [n for n in nodes if all(w in _words(n) for w in wanted)]


def _version(html: str) -> str:
    return hashlib.blake2b(html.encode(), digest_size=8).hexdigest()


def _card(node: Json) -> dict[str, Any]:
    bars: list[dict[str, Any]] = node["gpu_bars"]
    return {
        **node,
        "gpus_assigned": sum(1 for g in bars if g.get("in_use")),
        "gpu_used": sum(int(g["used"]) for g in bars),
        "gpu_total": sum(int(g["total"]) for g in bars),
    }


@dataclass(frozen=True, slots=True)
class NodesView:
    """What the nodes page shows for one filter."""

    q: str
    page: int
    summary: Part
    cards: list[Part]


def nodes_view(
    renderer: Renderer,
    nodes: Sequence[Json],
    q: str,
    page: int = 1,
    views: Callable[[Sequence[str]], list[Json]] | None = None,
    *,
    can_change: bool,
) -> NodesView:
    """The cards on page `page` of those that match `q`, rendered (with drain buttons
    when `can_change`), and the summary over every match. A page past the last shows
    the last. `nodes` need only what the filter and the summary read (id, hostname,
    state, draining, labels, fabric) when `views` gives the full views of the nodes on
    the page."""
    shown = sorted(filter_nodes(nodes, q), key=lambda n: str(n["id"]))
    pages = max(1, -(-len(shown) // PAGE_SIZE))
    page = min(page, pages)
    first = (page - 1) * PAGE_SIZE
    on_page = shown[first : first + PAGE_SIZE]
    if views is not None:
        on_page = views([str(n["id"]) for n in on_page])
    cards = []
    for node in node_cards(on_page):
        html = renderer.render("node_card.html", {"node": _card(node), "can_change": can_change})
        cards.append(Part(str(node["id"]), Markup(html), _version(html)))
    summary_html = renderer.render(
        "node_summary.html",
        {
            "node_states": ordered_counts(Counter(n["state"] for n in shown), NODE_STATES),
            "q": q,
            "shown": len(shown),
            "total": len(nodes),
            "page": page,
            "pages": pages,
            "first": first + 1,
            "last": first + min(PAGE_SIZE, len(shown) - first),
        },
    )
    summary = Part(SUMMARY_ID, Markup(summary_html), _version(summary_html))
    return NodesView(q, page, summary, cards)


def page_url(base: str, q: str, page: int) -> str:
    """The nodes page's address for filter `q` and page `page`."""
    params = [("q", q)] if q else []
    params += [("page", str(page))] if page > 1 else []
    return base + (f"?{urlencode(params)}" if params else "")


def known_versions(values: Iterable[str]) -> dict[str, str]:
    """`v` parameters ("ID VERSION") as id -> version; malformed ones are ignored."""
    known = {}
    for value in values:
        node_id, _, version = value.rpartition(" ")
        if node_id and version:
            known[node_id] = version
    return known


def node_changes(renderer: Renderer, view: NodesView, known: Mapping[str, str]) -> str | None:
    """The out-of-band swaps that bring a page showing `known` to `view`; None when
    it already shows it."""
    summary = view.summary if known.get(SUMMARY_ID) != view.summary.version else None
    current = {c.id for c in view.cards}
    changed = [c for c in view.cards if c.id in known and known[c.id] != c.version]
    added = [c for c in view.cards if c.id not in known]
    removed = [k for k in known if k != SUMMARY_ID and k not in current]
    if summary is None and not changed and not added and not removed:
        return None
    return renderer.render(
        "live/node_changes.html",
        {"summary": summary, "changed": changed, "added": added, "removed": removed},
    )
