"""Password hashing: argon2id, checked off the event loop, rehashed when the cost changes."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from argon2 import PasswordHasher, Type

from llmgw.auth import (
    MIN_PASSWORD_LENGTH,
    Passwords,
    PasswordsBusy,
    UserInputError,
    check_password,
)

CHEAP = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)


async def test_a_hash_verifies_its_password_and_no_other() -> None:
    passwords = Passwords(hasher=CHEAP)
    stored = await passwords.hash("correct horse battery")

    assert stored.startswith("$argon2id$")
    assert "correct horse" not in stored
    assert await passwords.verify(stored, "correct horse battery")
    assert not await passwords.verify(stored, "correct horse batterY")
    assert not await passwords.verify("$argon2id$damaged", "correct horse battery")
    assert not await passwords.verify("not a hash at all", "correct horse battery")


async def test_two_hashes_of_one_password_differ() -> None:
    passwords = Passwords(hasher=CHEAP)
    assert await passwords.hash("same password here") != await passwords.hash("same password here")


async def test_a_hash_with_other_parameters_needs_a_rehash() -> None:
    old = Passwords(hasher=CHEAP)
    new = Passwords(hasher=PasswordHasher(time_cost=2, memory_cost=1024, parallelism=1))
    stored = await old.hash("correct horse battery")

    assert not old.needs_rehash(stored)
    assert new.needs_rehash(stored)
    assert await new.verify(stored, "correct horse battery")
    assert new.needs_rehash("garbage")


async def test_the_defaults_are_argon2id_and_do_not_block_the_event_loop() -> None:
    passwords = Passwords()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    stored = await passwords.hash("correct horse battery")
    assert stored.startswith("$argon2id$v=19$m=65536,t=3,p=4$")
    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    try:
        assert await passwords.verify(stored, "correct horse battery")
        # A verification blocking the loop would let the ticker run not at all.
        assert ticks >= 2
    finally:
        task.cancel()


async def test_verifying_for_nobody_does_a_real_verification() -> None:
    calls: list[str] = []

    class Counting(PasswordHasher):
        def verify(self, hash: str | bytes, password: str | bytes) -> bool:
            calls.append("verify")
            return super().verify(hash, password)

    passwords = Passwords(hasher=Counting(time_cost=1, memory_cost=1024, parallelism=1))
    await passwords.verify_nobody("anything at all")
    await passwords.verify_nobody("x" * 5000)
    assert calls == ["verify", "verify"]


def test_only_argon2id_is_accepted() -> None:
    with pytest.raises(ValueError, match="argon2id"):
        Passwords(hasher=PasswordHasher(type=Type.I))


def test_short_passwords_are_refused_saying_how_long_they_must_be() -> None:
    with pytest.raises(
        UserInputError, match=r"too short: it needs at least 12 characters \(got 11\)"
    ):
        check_password("a" * (MIN_PASSWORD_LENGTH - 1))
    check_password("a" * MIN_PASSWORD_LENGTH)
    with pytest.raises(UserInputError, match="too long"):
        check_password("a" * 1025)


async def test_hashes_run_in_the_pool_given_and_too_many_waiting_are_refused() -> None:
    started = threading.Event()
    release = threading.Event()
    threads: list[str] = []

    class Blocking(PasswordHasher):
        def verify(self, hash: str | bytes, password: str | bytes) -> bool:
            threads.append(threading.current_thread().name)
            started.set()
            release.wait(30)
            return super().verify(hash, password)

    stored = await Passwords(hasher=CHEAP).hash("correct horse battery")
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="login-pool") as pool:
        passwords = Passwords(
            hasher=Blocking(time_cost=1, memory_cost=1024, parallelism=1),
            executor=pool,
            max_waiting=2,
        )
        running = asyncio.create_task(passwords.verify(stored, "correct horse battery"))
        await asyncio.to_thread(started.wait, 30)
        queued = asyncio.create_task(passwords.verify(stored, "wrong"))
        await asyncio.sleep(0)
        # One checking, one waiting for the pool's only thread: a third is refused.
        with pytest.raises(PasswordsBusy, match="too many logins are being checked at once"):
            await passwords.verify(stored, "another guess")
        release.set()
        assert await running and not await queued
        # Room again once they are done.
        assert await passwords.verify(stored, "correct horse battery")
    assert threads and all(name.startswith("login-pool") for name in threads)
