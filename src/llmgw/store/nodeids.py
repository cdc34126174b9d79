"""Node identities: which key owns each node id, and the keys that were revoked.

A node id belongs to the key (SHA-256 of a certificate's SubjectPublicKeyInfo,
hex; see `llmgw.pki.keyhash`) that first claimed it. The agent service claims
the id at every Register that comes with a client certificate:

- `bound`: the id was free and now belongs to this key;
- `already`: it belonged to this key (its `last_seen_at` moves on);
- `taken`: it belongs to another key (the binding says since when), and
  nothing changed;
- `revoked`: this key is on the deny-list (`llmgw nodes remove`).

A Join also binds the join token's labels and fabric labels to the id
(`claim(..., bind=...)`); every later claim returns them with the binding, so
the control plane can hold a node to them whatever its agent declares. A
renewal with a new key (`rebind`) keeps them; a revocation frees them with the
id.

`revoke` puts the key bound to a node id on the deny-list and frees every id
that key held, so the node can join again with a new key and take its id back.
Revoked keys stay listed for good: a revocation is never undone.

Race-safety: the node id is the primary key, so of two servers inserting the
same id at once one insert fails and that claim reads what the other wrote. A
binding whose key was revoked (a claim racing a revocation can leave one) does
not hold its id: the next claim with another key takes it over.

Not guaranteed: that a claim sees a revocation committed after the claim began
(on PostgreSQL a claim racing `revoke` may still answer `bound` or `already`
once; the next Register is refused). Nothing here checks certificates; the
caller hands in the hash of a key the TLS handshake has verified.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import RowMapping, delete, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from llmgw.store.engine import transaction
from llmgw.store.errors import Conflict, InvalidValue
from llmgw.store.tables import node_identities, node_revocations

MAX_NODE_ID = 253  # a DNS name's length: node ids default to the host name
MAX_REASON = 500
_KEY_HASH = re.compile(r"^[0-9a-f]{64}$")
# A claim that loses an insert race reads the winner's row; losing more than a
# few times in a row means rows are being deleted and inserted in a loop.
_CLAIM_ATTEMPTS = 3

ClaimOutcome = Literal["bound", "already", "taken", "revoked"]


@dataclass(frozen=True, slots=True)
class NodeBinding:
    """A node id and the key that owns it, with the labels its join token binds to it
    (None: no token's labels are bound, e.g. a certificate of the operator's own PKI)."""

    node_id: str
    key_hash: str
    bound_at: datetime  # when the key first claimed the id
    last_seen_at: datetime  # the key's latest claim of it
    labels: Mapping[str, str] | None = None
    fabric: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class BoundLabels:
    """The labels and fabric labels a join token fixes for the node that joins with it."""

    labels: Mapping[str, str] = field(default_factory=dict)
    fabric: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Revocation:
    """A key on the deny-list; `node_id` is the id it held when revoked."""

    key_hash: str
    node_id: str
    revoked_at: datetime
    reason: str


@dataclass(frozen=True, slots=True)
class Claim:
    """What `claim` found: `binding` is the id's owner (this key or, when `taken`,
    another); `revocation` is set only when `revoked` (then `binding` is None)."""

    outcome: ClaimOutcome
    node_id: str
    binding: NodeBinding | None
    revocation: Revocation | None = None


class NodeIdentityRepository:
    """Node id bindings and revoked keys; every method is one short transaction."""

    def __init__(self, *, engine: AsyncEngine) -> None:
        self._engine = engine
        self._postgres = engine.dialect.name == "postgresql"

    async def claim(
        self, node_id: str, key_hash: str, *, now: datetime, bind: BoundLabels | None = None
    ) -> Claim:
        """Bind `node_id` to `key_hash` unless another key owns it; see the module docstring.

        `bind` (a Join: the token's labels) replaces the labels bound to the id when
        the claim succeeds; without it they are kept (and returned in the binding).
        """
        _check_node_id(node_id)
        _check_key_hash(key_hash)
        for _ in range(_CLAIM_ATTEMPTS):
            try:
                async with transaction(self._engine, f"claiming node id {node_id!r}") as conn:
                    return await self._claim(conn, node_id, key_hash, now, bind)
            except IntegrityError:
                continue  # another claim inserted the id first: read what it wrote
        raise Conflict(
            f"claiming node id {node_id!r} lost {_CLAIM_ATTEMPTS} races in a row with other "
            "servers; the agent's next Register tries again"
        )

    async def claim_many(
        self, requests: Sequence[tuple[str, str]], *, now: datetime
    ) -> list[Claim | InvalidValue]:
        """Claim each `(node_id, key_hash)` as `claim` does (without labels to bind), all
        in one transaction: a storm of Registers costs one commit, not one per node.

        Answers in the order asked; an invalid node id or key hash gets its
        `InvalidValue` and does not spoil the others. Two requests for one id are
        applied in order (the second sees the first). A race lost with another
        server (an id it inserted meanwhile) rolls the batch back and claims each
        one on its own.
        """
        answers: list[Claim | InvalidValue | None] = []
        valid: list[tuple[int, str, str]] = []
        for node_id, key_hash in requests:
            try:
                _check_node_id(node_id)
                _check_key_hash(key_hash)
            except InvalidValue as exc:
                answers.append(exc)
                continue
            valid.append((len(answers), node_id, key_hash))
            answers.append(None)
        if valid:
            try:
                async with transaction(self._engine, f"claiming {len(valid)} node ids") as conn:
                    claims = [await self._claim(conn, n, k, now, None) for _, n, k in valid]
            except (IntegrityError, Conflict):
                claims = [await self.claim(n, k, now=now) for _, n, k in valid]
            for (index, _, _), claim in zip(valid, claims, strict=True):
                answers[index] = claim
        return [a for a in answers if a is not None]

    async def _claim(
        self,
        conn: AsyncConnection,
        node_id: str,
        key_hash: str,
        now: datetime,
        bind: BoundLabels | None,
    ) -> Claim:
        revoked = await _revocation(conn, key_hash)
        if revoked is not None:
            return Claim("revoked", node_id, None, revoked)
        labels = {} if bind is None else _bound_values(bind)
        row = await _binding(conn, node_id)
        if row is None:
            await conn.execute(
                node_identities.insert().values(
                    node_id=node_id, key_hash=key_hash, bound_at=now, last_seen_at=now, **labels
                )
            )
            bound = _to_binding({**_empty(node_id, key_hash, now), **labels})
            return Claim("bound", node_id, bound)
        if row.key_hash == key_hash:
            await conn.execute(
                update(node_identities)
                .where(node_identities.c.node_id == node_id, node_identities.c.key_hash == key_hash)
                .values(last_seen_at=now, **labels)
            )
            kept = {"labels": row.labels, "fabric": row.fabric}
            return Claim(
                "already",
                node_id,
                _to_binding(
                    {**_empty(node_id, key_hash, now), "bound_at": row.bound_at, **kept, **labels}
                ),
            )
        if await _revocation(conn, row.key_hash) is None:
            return Claim("taken", node_id, row)
        # The owner was revoked after a racing claim re-bound it: the id is free, and
        # so are the labels its token bound.
        fresh = {"labels": None, "fabric": None, **labels}
        result = await conn.execute(
            update(node_identities)
            .where(node_identities.c.node_id == node_id, node_identities.c.key_hash == row.key_hash)
            .values(key_hash=key_hash, bound_at=now, last_seen_at=now, **fresh)
        )
        if result.rowcount != 1:
            raise Conflict(f"node id {node_id!r} changed owner while it was being claimed")
        return Claim("bound", node_id, _to_binding({**_empty(node_id, key_hash, now), **fresh}))

    async def rebind(
        self, node_id: str, *, old_key_hash: str, new_key_hash: str, now: datetime
    ) -> Claim:
        """Move `node_id` from `old_key_hash` to `new_key_hash` (a renewal with a new key).

        The caller has verified that the node holds the old key. `taken` when the
        id belongs to a third key, `revoked` when either key is revoked; an id
        that has no owner is simply bound to the new key.
        """
        _check_node_id(node_id)
        _check_key_hash(old_key_hash)
        _check_key_hash(new_key_hash)
        async with transaction(self._engine, f"re-keying node id {node_id!r}") as conn:
            for key in (old_key_hash, new_key_hash):
                revoked = await _revocation(conn, key)
                if revoked is not None:
                    return Claim("revoked", node_id, None, revoked)
            row = await _binding(conn, node_id)
            if row is not None and row.key_hash not in (old_key_hash, new_key_hash):
                return Claim("taken", node_id, row)
            bound_at = now if row is None else row.bound_at
            if row is None:
                await conn.execute(
                    node_identities.insert().values(
                        node_id=node_id, key_hash=new_key_hash, bound_at=now, last_seen_at=now
                    )
                )
            else:
                await conn.execute(
                    update(node_identities)
                    .where(node_identities.c.node_id == node_id)
                    .values(key_hash=new_key_hash, last_seen_at=now)
                )
            kept = (None, None) if row is None else (row.labels, row.fabric)
            return Claim(
                "already", node_id, NodeBinding(node_id, new_key_hash, bound_at, now, *kept)
            )

    async def binding(self, node_id: str) -> NodeBinding | None:
        """The key that owns `node_id`, or None when no key does."""
        async with transaction(self._engine, f"reading node id {node_id!r}") as conn:
            return await _binding(conn, node_id)

    async def bindings(self) -> builtins.list[NodeBinding]:
        """Every bound node id, by id."""
        stmt = select(node_identities).order_by(node_identities.c.node_id)
        async with transaction(self._engine, "listing node identities") as conn:
            return [_to_binding(row._mapping) for row in await conn.execute(stmt)]

    async def revocation(self, key_hash: str) -> Revocation | None:
        """The revocation of `key_hash`, or None when it is not revoked."""
        async with transaction(self._engine, "reading the node key deny-list") as conn:
            return await _revocation(conn, key_hash)

    async def is_revoked(self, key_hash: str) -> bool:
        """Whether `key_hash` is on the deny-list."""
        return await self.revocation(key_hash) is not None

    async def revoke(self, node_id: str, *, now: datetime, reason: str) -> Revocation | None:
        """Revoke the key that owns `node_id` and free every id it held.

        None when no key owns `node_id` (a node that connected without a
        certificate has nothing to revoke). A key revoked before keeps its first
        revocation, which is returned.
        """
        _check_node_id(node_id)
        if len(reason) > MAX_REASON:
            raise InvalidValue(f"a revocation reason is at most {MAX_REASON} characters")
        async with transaction(self._engine, f"revoking node {node_id!r}") as conn:
            row = await _binding(conn, node_id)
            if row is None:
                return None
            insert = (postgresql.insert if self._postgres else sqlite.insert)(node_revocations)
            await conn.execute(
                insert.values(
                    key_hash=row.key_hash, node_id=node_id, revoked_at=now, reason=reason
                ).on_conflict_do_nothing(index_elements=[node_revocations.c.key_hash])
            )
            await conn.execute(
                delete(node_identities).where(node_identities.c.key_hash == row.key_hash)
            )
            return await _revocation(conn, row.key_hash)

    async def revocations(self) -> builtins.list[Revocation]:
        """Every revoked key, newest first."""
        stmt = select(node_revocations).order_by(
            node_revocations.c.revoked_at.desc(), node_revocations.c.key_hash
        )
        async with transaction(self._engine, "listing revoked node keys") as conn:
            return [_to_revocation(row._mapping) for row in await conn.execute(stmt)]


def _check_node_id(node_id: str) -> None:
    if not node_id or len(node_id) > MAX_NODE_ID:
        raise InvalidValue(f"a node id is 1 to {MAX_NODE_ID} characters, got {node_id[:80]!r}")


def _check_key_hash(key_hash: str) -> None:
    if not _KEY_HASH.match(key_hash):
        raise InvalidValue(
            f"a node key hash is 64 lowercase hex digits (SHA-256), got {key_hash[:80]!r}"
        )


async def _binding(conn: AsyncConnection, node_id: str) -> NodeBinding | None:
    stmt = select(node_identities).where(node_identities.c.node_id == node_id)
    row = (await conn.execute(stmt)).first()
    return None if row is None else _to_binding(row._mapping)


async def _revocation(conn: AsyncConnection, key_hash: str) -> Revocation | None:
    stmt = select(node_revocations).where(node_revocations.c.key_hash == key_hash)
    row = (await conn.execute(stmt)).first()
    return None if row is None else _to_revocation(row._mapping)


def _to_binding(row: RowMapping | Mapping[str, Any]) -> NodeBinding:
    labels, fabric = row.get("labels"), row.get("fabric")
    return NodeBinding(
        node_id=row["node_id"],
        key_hash=row["key_hash"],
        bound_at=row["bound_at"],
        last_seen_at=row["last_seen_at"],
        labels=None if labels is None else {str(k): str(v) for k, v in labels.items()},
        fabric=None if fabric is None else {str(k): str(v) for k, v in fabric.items()},
    )


def _empty(node_id: str, key_hash: str, now: datetime) -> dict[str, Any]:
    return {"node_id": node_id, "key_hash": key_hash, "bound_at": now, "last_seen_at": now}


def _bound_values(bind: BoundLabels) -> dict[str, Any]:
    return {"labels": dict(bind.labels), "fabric": dict(bind.fabric)}


def _to_revocation(row: RowMapping) -> Revocation:
    return Revocation(
        key_hash=row["key_hash"],
        node_id=row["node_id"],
        revoked_at=row["revoked_at"],
        reason=row["reason"],
    )
