"""Storing the cluster PKI: the CA (its key sealed), join tokens, and a log of issued certificates.

The store never sees a private key in the clear nor a token's secret: the CA's
key arrives sealed by the caller (AES-256-GCM under the cluster key file), a
token arrives as the SHA-256 of its secret plus its public root certificate.

`create_ca` is race-safe: a partial unique index allows one active CA (and one
next), so when two servers start on an empty store at once, one insert wins and
the other server gets the winner's row back. A rotation stores a "next" CA
(`begin_rotation`), then swaps it in and retires the old one in one transaction
(`finish_rotation`); retired CAs stay listed so what they issued still verifies.

`use_token` counts a use only while the token is usable (not revoked, not
expired, uses left), with a compare-and-set on the use count, so two joins
racing for a token's last use get one success and one `TokenUnusable`.

Not guaranteed: that a token revoked on one server stops being trusted for TLS
on another before that server's next poll (Join itself reads the store, so a
revoked token never yields a certificate).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from llmgw.store.engine import transaction
from llmgw.store.errors import Conflict, InvalidValue, NotFound, StoreError
from llmgw.store.models import require_aware
from llmgw.store.tables import cluster_cas, issued_certificates, join_tokens


@dataclass(frozen=True, slots=True)
class StoredCa:
    """A cluster CA as stored: `id` is the SHA-256 of its SubjectPublicKeyInfo."""

    id: str
    role: str  # "active", "next" or "retired"
    cert_pem: str
    key_sealed: bytes
    sealing_key_id: str
    created_at: datetime
    not_after: datetime
    retired_at: datetime | None


@dataclass(frozen=True, slots=True)
class StoredJoinToken:
    """A join token without its secret (only the secret's hash is stored)."""

    id: str
    secret_hash: str
    root_pem: str
    labels: dict[str, str]
    max_uses: int | None
    uses: int
    created_at: datetime
    expires_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None
    # Fabric labels the token fixes for its nodes, like `labels`.
    fabric: dict[str, str] = field(default_factory=dict)

    def unusable_because(self, now: datetime) -> str | None:
        """Why the token cannot be used now (a sentence), or None when it can."""
        if self.revoked_at is not None:
            return f"join token {self.id} was revoked at {self.revoked_at:%Y-%m-%d %H:%M:%S} UTC"
        if now >= self.expires_at:
            return f"join token {self.id} expired at {self.expires_at:%Y-%m-%d %H:%M:%S} UTC"
        if self.max_uses is not None and self.uses >= self.max_uses:
            times = "once" if self.max_uses == 1 else f"{self.max_uses} times"
            return f"join token {self.id} is used up (it was good for joining {times})"
        return None


@dataclass(frozen=True, slots=True)
class IssuedCertificate:
    """One certificate the cluster CA signed, for the audit trail."""

    serial: str
    kind: str  # "server" or "node"
    subject: str
    ca_id: str
    spki_sha256: str
    token_id: str | None
    issued_at: datetime
    not_after: datetime


class TokenUnusable(StoreError):
    """A join token that exists but is revoked, expired or used up; the message says which."""


class PkiRepository:
    """The cluster CA, join tokens and issued certificates; each method is one transaction."""

    def __init__(self, *, engine: AsyncEngine, clock: Callable[[], datetime]) -> None:
        self._engine = engine
        self._clock = clock

    # ---- the CA ----

    async def cas(self) -> list[StoredCa]:
        """Every CA on record (active first, then next, then retired by age)."""
        order = {"active": 0, "next": 1, "retired": 2}
        async with transaction(self._engine, "reading the cluster CA") as conn:
            rows = [_ca(r._mapping) for r in await conn.execute(select(cluster_cas))]
        return sorted(rows, key=lambda ca: (order.get(ca.role, 3), -ca.created_at.timestamp()))

    async def active_ca(self) -> StoredCa | None:
        return next((ca for ca in await self.cas() if ca.role == "active"), None)

    async def create_ca(self, ca: StoredCa) -> StoredCa:
        """Store `ca` as the active CA, unless one exists: then return that one instead."""
        if ca.role != "active":
            raise InvalidValue(f"a new cluster CA is stored as active, not {ca.role!r}")
        require_aware("not_after", ca.not_after)
        try:
            async with transaction(self._engine, "storing the cluster CA") as conn:
                await conn.execute(cluster_cas.insert().values(_ca_row(ca)))
        except IntegrityError:
            existing = await self.active_ca()
            if existing is None:
                raise
            return existing
        return ca

    async def begin_rotation(self, ca: StoredCa) -> StoredCa:
        """Store `ca` as the next CA; `Conflict` if a rotation is already under way."""
        if ca.role != "next":
            raise InvalidValue(f"a rotation's new CA is stored as next, not {ca.role!r}")
        try:
            async with transaction(self._engine, "storing the next cluster CA") as conn:
                await conn.execute(cluster_cas.insert().values(_ca_row(ca)))
        except IntegrityError as exc:
            raise Conflict(
                "a CA rotation is already under way: finish it with `llmgw certs rotate-ca "
                "--finish` before starting another"
            ) from exc
        return ca

    async def finish_rotation(self) -> StoredCa:
        """Make the next CA the active one and retire the old; returns the new active CA.

        `NotFound` when no rotation is under way.
        """
        now = self._clock()
        async with transaction(self._engine, "finishing the cluster CA rotation") as conn:
            found = (
                await conn.execute(select(cluster_cas).where(cluster_cas.c.role == "next"))
            ).first()
            if found is None:
                raise NotFound(
                    "no CA rotation is under way: start one with `llmgw certs rotate-ca`"
                )
            # Retire first: one CA at a time may be active (the partial unique index).
            await conn.execute(
                update(cluster_cas)
                .where(cluster_cas.c.role == "active")
                .values(role="retired", retired_at=now)
            )
            await conn.execute(
                update(cluster_cas).where(cluster_cas.c.id == found.id).values(role="active")
            )
        return StoredCa(**{**_ca_row(_ca(found._mapping)), "role": "active"})

    # ---- join tokens ----

    async def create_token(self, token: StoredJoinToken) -> StoredJoinToken:
        require_aware("expires_at", token.expires_at)
        if token.max_uses is not None and token.max_uses < 1:
            raise InvalidValue(f"max_uses {token.max_uses}: a token must allow at least one join")
        async with transaction(self._engine, f"creating join token {token.id}") as conn:
            await conn.execute(join_tokens.insert().values(_token_row(token)))
        return token

    async def token(self, token_id: str) -> StoredJoinToken | None:
        async with transaction(self._engine, f"reading join token {token_id}") as conn:
            row = (
                await conn.execute(select(join_tokens).where(join_tokens.c.id == token_id))
            ).first()
        return None if row is None else _token(row._mapping)

    async def tokens(self) -> builtins.list[StoredJoinToken]:
        """Every token, newest first, spent ones included."""
        stmt = select(join_tokens).order_by(join_tokens.c.created_at.desc(), join_tokens.c.id)
        async with transaction(self._engine, "listing join tokens") as conn:
            return [_token(r._mapping) for r in await conn.execute(stmt)]

    async def usable_tokens(self, now: datetime) -> builtins.list[StoredJoinToken]:
        """Tokens that can still be used at `now` (not revoked, not expired, uses left)."""
        stmt = select(join_tokens).where(
            join_tokens.c.revoked_at.is_(None),
            join_tokens.c.expires_at > now,
            or_(join_tokens.c.max_uses.is_(None), join_tokens.c.uses < join_tokens.c.max_uses),
        )
        async with transaction(self._engine, "reading usable join tokens") as conn:
            return [_token(r._mapping) for r in await conn.execute(stmt)]

    async def tokens_expiring_after(self, cutoff: datetime) -> builtins.list[StoredJoinToken]:
        """Tokens whose expiry is after `cutoff`, revoked and used-up ones included."""
        stmt = select(join_tokens).where(join_tokens.c.expires_at > cutoff)
        async with transaction(self._engine, "reading recent join tokens") as conn:
            return [_token(r._mapping) for r in await conn.execute(stmt)]

    async def revoke_token(self, token_id: str) -> StoredJoinToken:
        """Revoke a token (`NotFound` if there is none); revoking twice keeps the first time."""
        now = self._clock()
        async with transaction(self._engine, f"revoking join token {token_id}") as conn:
            await conn.execute(
                update(join_tokens)
                .where(join_tokens.c.id == token_id, join_tokens.c.revoked_at.is_(None))
                .values(revoked_at=now)
            )
            row = (
                await conn.execute(select(join_tokens).where(join_tokens.c.id == token_id))
            ).first()
        if row is None:
            raise NotFound(
                f"there is no join token {token_id!r}; `llmgw nodes token list` shows the ids"
            )
        return _token(row._mapping)

    async def use_token(self, token_id: str) -> StoredJoinToken:
        """Count one use of a usable token; returns it after the use.

        One conditional increment, so joins racing on one token (a fleet joining
        at once) queue on its row instead of retrying a compare-and-set that many
        of them lose. `NotFound` for an unknown id, `TokenUnusable` (saying why)
        for a revoked, expired or used-up one.
        """
        now = self._clock()
        counted = (
            update(join_tokens)
            .where(
                join_tokens.c.id == token_id,
                join_tokens.c.revoked_at.is_(None),
                join_tokens.c.expires_at > now,
                or_(
                    join_tokens.c.max_uses.is_(None),
                    join_tokens.c.uses < join_tokens.c.max_uses,
                ),
            )
            .values(uses=join_tokens.c.uses + 1, last_used_at=now)
            .returning(*join_tokens.c)
        )
        async with transaction(self._engine, f"using join token {token_id}") as conn:
            row = (await conn.execute(counted)).first()
        if row is not None:
            return _token(row._mapping)
        token = await self.token(token_id)
        if token is None:
            raise NotFound(f"there is no join token {token_id!r}")
        raise TokenUnusable(
            token.unusable_because(now) or f"join token {token_id} cannot be used now"
        )

    # ---- issued certificates ----

    async def record_certificate(self, cert: IssuedCertificate) -> None:
        async with transaction(self._engine, f"recording certificate {cert.serial}") as conn:
            await conn.execute(
                issued_certificates.insert().values(
                    serial=cert.serial,
                    kind=cert.kind,
                    subject=cert.subject,
                    ca_id=cert.ca_id,
                    spki_sha256=cert.spki_sha256,
                    token_id=cert.token_id,
                    issued_at=cert.issued_at,
                    not_after=cert.not_after,
                )
            )

    async def certificates(
        self, *, kind: str | None = None, subject: str | None = None
    ) -> builtins.list[IssuedCertificate]:
        """Issued certificates, newest first, optionally of one kind and subject."""
        stmt = select(issued_certificates).order_by(issued_certificates.c.issued_at.desc())
        if kind is not None:
            stmt = stmt.where(issued_certificates.c.kind == kind)
        if subject is not None:
            stmt = stmt.where(issued_certificates.c.subject == subject)
        async with transaction(self._engine, "listing issued certificates") as conn:
            return [IssuedCertificate(**dict(r._mapping)) for r in await conn.execute(stmt)]


def _ca_row(ca: StoredCa) -> dict[str, Any]:
    return {
        "id": ca.id,
        "role": ca.role,
        "cert_pem": ca.cert_pem,
        "key_sealed": ca.key_sealed,
        "sealing_key_id": ca.sealing_key_id,
        "created_at": ca.created_at,
        "not_after": ca.not_after,
        "retired_at": ca.retired_at,
    }


def _ca(row: RowMapping) -> StoredCa:
    return StoredCa(
        id=row["id"],
        role=row["role"],
        cert_pem=row["cert_pem"],
        key_sealed=bytes(row["key_sealed"]),
        sealing_key_id=row["sealing_key_id"],
        created_at=row["created_at"],
        not_after=row["not_after"],
        retired_at=row["retired_at"],
    )


def _token_row(token: StoredJoinToken) -> dict[str, Any]:
    return {
        "id": token.id,
        "secret_hash": token.secret_hash,
        "root_pem": token.root_pem,
        "labels": dict(token.labels),
        "max_uses": token.max_uses,
        "uses": token.uses,
        "created_at": token.created_at,
        "expires_at": token.expires_at,
        "last_used_at": token.last_used_at,
        "revoked_at": token.revoked_at,
        "fabric": dict(token.fabric),
    }


def _token(row: RowMapping) -> StoredJoinToken:
    return StoredJoinToken(
        id=row["id"],
        secret_hash=row["secret_hash"],
        root_pem=row["root_pem"],
        labels=dict(row["labels"] or {}),
        max_uses=row["max_uses"],
        uses=row["uses"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        last_used_at=row["last_used_at"],
        revoked_at=row["revoked_at"],
        fabric=dict(row["fabric"] or {}),
    )
