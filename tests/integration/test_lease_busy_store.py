"""The leader's lease on a busy SQLite store: a real `llmgw server`, and this test
process holding SQLite's write lock from another connection.

A registration storm keeps the store's write lock busy with bulk writes; the lease
(TTL 15 s, renewed every 5 s, each try waiting up to SQLite's 5 s busy timeout)
must survive a store that is busy for most of its TTL, and the leader must still
step down, never later than the lease's expiry as stored, when the store stays
locked past it.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from procs import Server, wait_for

TTL = 15.0  # the default: the renewal every TTL/3 meets SQLite's 5 s busy timeout
# How long the lock is held after a renewal: past the next renewal (TTL/3) plus the
# busy timeout (5 s), so that renewal fails; 4 s short of the lease's expiry.
HOLD = 11.0


def leader(server: Server) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(server.admin + "/admin/api/leader", timeout=10).json()
    return data


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    (tmp_path / "llmgw.yaml").write_text(f"control: {{lease_ttl: {TTL}}}\n")
    # A dead static endpoint (never ready): router-only mode needs one; nothing is
    # served here.
    started = Server(
        "--config", str(tmp_path / "llmgw.yaml"), "--endpoint", "x=http://127.0.0.1:1=m",
        data_dir=tmp_path / "data", wait_ready=False,
    )  # fmt: skip
    try:
        wait_for(lambda: leader(started)["role"] == "leader", "the server to lead")
        yield started
    finally:
        started.proc.stop()


def _connect(server: Server) -> sqlite3.Connection:
    conn = sqlite3.connect(server.data_dir / "llmgw.db", timeout=60, isolation_level=None)
    return conn


def _after_a_renewal(server: Server) -> dict[str, Any]:
    """Wait for the lease's expiry to move (a renewal just committed); its view."""
    before = leader(server)["lease_expires_at"]
    return wait_for(
        lambda: (seen := leader(server))["lease_expires_at"] != before and seen,
        "the leader to renew its lease",
        within=3 * TTL,
        every=0.02,
    )


def _stored_expiry(conn: sqlite3.Connection) -> datetime:
    row = conn.execute("SELECT expires_at FROM leases WHERE name = 'control'").fetchone()
    return datetime.fromisoformat(row[0]).replace(tzinfo=UTC)


def test_a_leader_keeps_its_lease_while_the_store_is_locked_for_most_of_the_ttl(
    server: Server,
) -> None:
    first = leader(server)
    conn = _connect(server)
    try:
        _after_a_renewal(server)
        renewed = time.monotonic()
        conn.execute("BEGIN IMMEDIATE")  # SQLite's write lock: every writer waits
        try:
            expiry = _stored_expiry(conn)
            while time.monotonic() < renewed + HOLD:
                sample = leader(server)
                assert sample["role"] == "leader", sample
        finally:
            conn.execute("COMMIT")
        # The renewal that met the lock failed and was retried, and one went through
        # before the lease ran out.
        wait_for(
            lambda: "cannot renew the lease" in server.proc.output(),
            "the renewal that met the lock to fail",
        )
        wait_for(
            lambda: datetime.fromisoformat(leader(server)["lease_expires_at"]) > expiry,
            "a renewal after the lock was released",
            within=TTL,
        )
        now = leader(server)
        assert now["role"] == "leader"
        assert now["role_since"] == first["role_since"], "it stepped down and came back"
        assert now["epoch"] == first["epoch"]
        assert "lost the lease" not in server.proc.output()
    finally:
        conn.close()


def test_a_leader_steps_down_by_its_stored_expiry_when_the_store_stays_locked(
    server: Server,
) -> None:
    conn = _connect(server)
    try:
        _after_a_renewal(server)
        conn.execute("BEGIN IMMEDIATE")
        try:
            expiry = _stored_expiry(conn)
            # The last request that found it leading was sent before the stored expiry.
            last_leading_sent: datetime | None = None
            deadline = time.monotonic() + 4 * TTL
            while time.monotonic() < deadline:
                sent = datetime.now(UTC)
                if leader(server)["role"] != "leader":
                    break
                last_leading_sent = sent
            else:
                raise AssertionError("the leader kept leading while the store stayed locked")
            assert last_leading_sent is not None
            assert last_leading_sent < expiry, (last_leading_sent, expiry)
            assert _stored_expiry(conn) == expiry  # no renewal got through the lock
            # It stops leading (`is_leader`) at once; the renewal in flight then ends
            # its term.
            wait_for(lambda: "lost the lease" in server.proc.output(), "the leader to end its term")
        finally:
            conn.execute("COMMIT")
        # Once the store answers again it takes the lease back.
        wait_for(lambda: leader(server)["role"] == "leader", "the server to lead again")
    finally:
        conn.close()
