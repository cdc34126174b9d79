"""A cluster PKI over a fresh SQLite store, for tests of joining and join tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

from llmgw.control.agentsvc.cluster_pki import ClusterPki, PkiSettings
from llmgw.pki.cluster import create_cluster_key
from llmgw.store import Store, open_store, store_url


def now() -> datetime:
    return datetime.now(UTC)


@asynccontextmanager
async def opened_pki(tmp_path: Path) -> AsyncIterator[tuple[Store, ClusterPki]]:
    """A migrated store and a PKI opened on it (server `s:1`, for 127.0.0.1); closed after."""
    store = await open_store(store_url(tmp_path / "data", None))
    await store.upgrade()
    pki = ClusterPki(
        repo=store.pki, key=create_cluster_key(tmp_path / "cluster.key"), server_id="s:1",
        server_names=["127.0.0.1"], wall_clock=now, nodeids=store.nodeids,
        settings=PkiSettings(
            ca_lifetime=timedelta(days=30), server_cert_lifetime=timedelta(days=1),
            node_cert_lifetime=timedelta(days=1), poll_interval=1.0,
        ),
    )  # fmt: skip
    try:
        await pki.open()
        yield store, pki
    finally:
        await store.close()
