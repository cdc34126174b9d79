"""Turning `--data-dir` / `--store` into a database URL the store can open.

Accepted: `sqlite:///PATH` (relative or absolute), `postgresql://USER[:PASS]@HOST[:PORT]/DB`
(also `postgres://`), and the explicit async forms `sqlite+aiosqlite://` and
`postgresql+asyncpg://`. Everything else is refused with a message that says what to pass.

Not guaranteed: that the database exists or can be reached; that is found out when
the store is opened.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from llmgw.store.errors import BadStoreUrl

DB_FILENAME = "llmgw.db"
USAGE = "--store must be sqlite:///PATH or postgresql://USER@HOST/DB"


def store_url(data_dir: Path | None, store: str | None) -> str:
    """The async database URL for the given options; `store` wins over `data_dir`.

    With only a data directory the database is `<data_dir>/llmgw.db` (SQLite).
    """
    if store:
        return normalize_url(store).render_as_string(hide_password=False)
    if data_dir is None:
        raise BadStoreUrl(
            f"no store given: pass --data-dir DIR (SQLite in DIR/{DB_FILENAME}) or {USAGE}"
        )
    path = (data_dir.expanduser() / DB_FILENAME).absolute()
    return URL.create("sqlite+aiosqlite", database=str(path)).render_as_string()


def normalize_url(raw: str) -> URL:
    """Parse and map a store URL to its async driver; raise `BadStoreUrl` if unusable."""
    try:
        url = make_url(raw)
    except ArgumentError as exc:
        raise BadStoreUrl(f"{USAGE}; got {raw!r}") from exc
    if url.drivername in ("sqlite", "sqlite+aiosqlite"):
        if not url.database or url.database == ":memory:":
            raise BadStoreUrl(
                f"{USAGE}; got {raw!r} (an in-memory database would vanish; give a file path)"
            )
        return url.set(drivername="sqlite+aiosqlite")
    if url.drivername in ("postgresql", "postgres", "postgresql+asyncpg"):
        if not url.host or not url.database:
            raise BadStoreUrl(
                f"{USAGE}; got {url.render_as_string()!r} (host and database are required)"
            )
        return url.set(drivername="postgresql+asyncpg")
    raise BadStoreUrl(
        f"{USAGE}; got {url.render_as_string()!r} (unsupported scheme {url.drivername!r})"
    )


def describe(url: URL) -> str:
    """The URL for messages and logs, without the password."""
    return url.render_as_string(hide_password=True)
