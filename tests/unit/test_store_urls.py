"""From --data-dir / --store to a database URL, and the errors people see when it is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.store import BadStoreUrl, StoreUnavailable, open_store, store_url


def test_a_data_dir_means_sqlite_inside_it(tmp_path: Path) -> None:
    assert store_url(tmp_path, None) == f"sqlite+aiosqlite:///{tmp_path}/llmgw.db"


def test_store_wins_over_the_data_dir(tmp_path: Path) -> None:
    assert store_url(tmp_path, "sqlite:///other.db") == "sqlite+aiosqlite:///other.db"
    assert (
        store_url(tmp_path, "postgresql://llmgw:s3cret@db.internal:5433/llmgw")
        == "postgresql+asyncpg://llmgw:s3cret@db.internal:5433/llmgw"
    )
    assert store_url(None, "postgres://u@h/d") == "postgresql+asyncpg://u@h/d"
    assert store_url(None, "postgresql+asyncpg://u@h/d") == "postgresql+asyncpg://u@h/d"


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("mysql://u@h/d", "unsupported scheme 'mysql'"),
        ("not a url", "got 'not a url'"),
        ("sqlite://", "in-memory"),
        ("sqlite:///:memory:", "in-memory"),
        ("postgresql://u:pw@/d", "host and database are required"),
        ("postgresql://u@h", "host and database are required"),
    ],
)
def test_bad_store_values_say_what_to_pass(raw: str, why: str) -> None:
    with pytest.raises(
        BadStoreUrl, match="--store must be sqlite:///PATH or postgresql://USER@HOST/DB"
    ) as info:
        store_url(None, raw)
    assert why in str(info.value)
    assert "pw" not in str(info.value)


def test_nothing_given_asks_for_a_data_dir_or_store() -> None:
    with pytest.raises(BadStoreUrl, match="pass --data-dir DIR"):
        store_url(None, None)


async def test_open_store_refuses_bad_urls_and_sqlite_schemas(tmp_path: Path) -> None:
    with pytest.raises(BadStoreUrl):
        await open_store("mysql://u@h/d")
    with pytest.raises(BadStoreUrl, match="only be chosen for PostgreSQL"):
        await open_store(store_url(tmp_path, None), schema="s")
    with pytest.raises(BadStoreUrl, match="not a plain PostgreSQL identifier"):
        await open_store("postgresql://postgres@127.0.0.1:5432/test", schema="x; drop")


async def test_an_unreachable_postgresql_fails_at_open() -> None:
    with pytest.raises(
        StoreUnavailable, match=r"127\.0\.0\.1:1/llmgw did not answer.*running and reachable"
    ) as info:
        await open_store("postgresql://llmgw:s3cret@127.0.0.1:1/llmgw")
    assert "s3cret" not in str(info.value)


async def test_an_unusable_sqlite_directory_is_reported(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(BadStoreUrl, match=r"cannot create .*file/data for the SQLite database"):
        await open_store(store_url(blocker / "data", None))


async def test_open_store_creates_the_sqlite_directory(tmp_path: Path) -> None:
    data_dir = tmp_path / "a" / "b"
    store = await open_store(store_url(data_dir, None))
    try:
        await store.upgrade()
        assert (data_dir / "llmgw.db").is_file()
        assert store.url == f"sqlite+aiosqlite:///{data_dir}/llmgw.db"
    finally:
        await store.close()
