"""Users and admin sessions in the store, on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from store_fixtures import START, FakeClock, clock_fixture, store_fixture, target_fixture  # noqa: F401

from llmgw.store import AlreadyExists, InvalidValue, NotFound, Store

HASH_A = "$argon2id$v=19$m=1024,t=1,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNo"
HASH_B = "$argon2id$v=19$m=1024,t=1,p=1$b3RoZXJzYWx0$b3RoZXJoYXNo"


def sid(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


async def open_session(store: Store, user_id: str, token: str, *, hours: float = 8) -> None:
    await store.sessions.create(
        session_id=sid(token),
        user_id=user_id,
        csrf_token="csrf-" + token,
        created_at=START,
        expires_at=START + timedelta(hours=hours),
    )


async def test_a_created_user_reads_back_by_id_and_name(store: Store) -> None:
    alice = await store.users.create("alice", HASH_A, admin_role="admin")
    bob = await store.users.create("bob", HASH_B, admin_role=None)

    assert alice.id.startswith("usr_") and alice.created_at == START
    assert alice.is_admin and not alice.disabled
    assert await store.users.get(alice.id) == alice
    assert await store.users.get_by_name("bob") == bob
    assert await store.users.get_by_name("carol") is None
    assert await store.users.list() == [alice, bob]


async def test_names_are_unique_even_after_disabling(store: Store) -> None:
    await store.users.create("alice", HASH_A, admin_role="admin")
    with pytest.raises(AlreadyExists, match="a user named 'alice' already exists"):
        await store.users.create("alice", HASH_B, admin_role=None)
    await store.users.disable("alice")
    with pytest.raises(AlreadyExists):
        await store.users.create("alice", HASH_B, admin_role=None)
    assert len(await store.users.list()) == 1


async def test_bad_values_are_refused(store: Store) -> None:
    with pytest.raises(InvalidValue, match="user name"):
        await store.users.create("", HASH_A, admin_role=None)
    with pytest.raises(InvalidValue, match="password_hash"):
        await store.users.create("alice", "plain text", admin_role=None)
    with pytest.raises(InvalidValue, match="session_id"):
        await store.sessions.create(
            session_id="token-itself",
            user_id="usr_x",
            csrf_token="c",
            created_at=START,
            expires_at=START,
        )


async def test_disabling_keeps_the_first_time_and_ends_the_sessions(
    store: Store, store_clock: FakeClock
) -> None:
    alice = await store.users.create("alice", HASH_A, admin_role="admin")
    bob = await store.users.create("bob", HASH_B, admin_role="admin")
    await open_session(store, alice.id, "a1")
    await open_session(store, bob.id, "b1")
    first = store_clock.advance(minutes=5)

    disabled = await store.users.disable("alice")
    store_clock.advance(minutes=5)
    again = await store.users.disable("alice")

    assert disabled.disabled_at == again.disabled_at == first
    assert await store.sessions.get(sid("a1")) is None
    assert await store.sessions.get(sid("b1")) is not None
    with pytest.raises(NotFound, match="there is no user 'carol'"):
        await store.users.disable("carol")


async def test_setting_a_password_ends_sessions_only_when_asked(store: Store) -> None:
    alice = await store.users.create("alice", HASH_A, admin_role="admin")
    await open_session(store, alice.id, "a1")

    kept = await store.users.set_password("alice", HASH_B, end_sessions=False)
    assert kept.password_hash == HASH_B
    assert await store.sessions.get(sid("a1")) is not None

    await store.users.set_password("alice", HASH_A, end_sessions=True)
    assert (await store.users.get(alice.id)).password_hash == HASH_A  # type: ignore[union-attr]
    assert await store.sessions.get(sid("a1")) is None
    with pytest.raises(NotFound):
        await store.users.set_password("carol", HASH_A, end_sessions=True)


async def test_sessions_are_created_read_touched_and_deleted(store: Store) -> None:
    alice = await store.users.create("alice", HASH_A, admin_role="admin")
    await open_session(store, alice.id, "a1")

    session = await store.sessions.get(sid("a1"))
    assert session is not None
    assert session.user_id == alice.id and session.csrf_token == "csrf-a1"
    assert session.created_at == session.last_seen_at == START
    assert session.expires_at == START + timedelta(hours=8)

    later = START + timedelta(minutes=30)
    await store.sessions.touch(sid("a1"), later)
    assert (await store.sessions.get(sid("a1"))).last_seen_at == later  # type: ignore[union-attr]

    assert await store.sessions.delete(sid("a1"))
    assert not await store.sessions.delete(sid("a1"))
    assert await store.sessions.get(sid("a1")) is None


async def test_a_session_needs_an_existing_user(store: Store) -> None:
    with pytest.raises(NotFound, match="no such user"):
        await open_session(store, "usr_missing", "x1")


async def test_expired_sessions_are_swept(store: Store) -> None:
    alice = await store.users.create("alice", HASH_A, admin_role="admin")
    await open_session(store, alice.id, "short", hours=1)
    await open_session(store, alice.id, "long", hours=8)

    assert await store.sessions.delete_expired(START + timedelta(minutes=59)) == 0
    assert await store.sessions.delete_expired(START + timedelta(hours=1)) == 1
    assert await store.sessions.get(sid("short")) is None
    assert await store.sessions.get(sid("long")) is not None
    assert await store.sessions.delete_for_user(alice.id) == 1
