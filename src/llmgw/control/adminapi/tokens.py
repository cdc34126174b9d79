"""Admin API for join tokens: `/admin/api/join-tokens` (list, create) and revoke.

The same operations as `llmgw nodes token`. `POST /admin/api/join-tokens` with
`{"ttl_seconds": 86400, "max_uses": null, "labels": {"k": "v"}, "fabric": {"k": "v"}}`
(every field optional) answers 201 with the token's view plus `token`, the whole join token,
and `agent_command`, the agent line that joins a node with it: shown this once
(the store keeps only a hash of its secret). `GET` lists every token, spent
ones included, without secrets. `POST /admin/api/join-tokens/{id}/revoke`
revokes one (404 when unknown). A token's `labels` and `fabric` bind: every node
that joins with it keeps them, whatever its agent declares (it may add keys).
When this server does not issue from the cluster CA (plaintext agents,
`agent_tls`, or no agent listener) every route answers 409 saying why.

Not guaranteed: that a token revoked here is refused by another server's TLS
handshake before that server's next poll; its Join is refused at once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from llmgw.control.adminapi.responses import error_response, json_response
from llmgw.store import NotFound, StoredJoinToken, StoreError

DEFAULT_TTL_SECONDS = 86400.0
MAX_TTL_SECONDS = 365 * 86400.0
# Matched whole (`fullmatch`): a key ending in a newline is not a key.
_LABEL_KEY = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?")
MAX_LABEL_VALUE = 253


class TokenIssuer(Protocol):
    """What the routes need; `ClusterPki` satisfies it."""

    async def create_token(
        self,
        *,
        ttl: timedelta,
        max_uses: int | None,
        labels: Mapping[str, str],
        fabric: Mapping[str, str] | None = None,
    ) -> tuple[str, StoredJoinToken]: ...

    async def revoke_token(self, token_id: str) -> StoredJoinToken: ...

    async def tokens(self) -> list[StoredJoinToken]: ...


def token_state(token: StoredJoinToken, now: datetime) -> str:
    if token.revoked_at is not None:
        return "revoked"
    if now >= token.expires_at:
        return "expired"
    if token.max_uses is not None and token.uses >= token.max_uses:
        return "used up"
    return "usable"


def token_view(token: StoredJoinToken, now: datetime) -> dict[str, Any]:
    def iso(ts: datetime | None) -> str | None:
        return None if ts is None else ts.isoformat()

    return {
        "id": token.id,
        "state": token_state(token, now),
        "labels": dict(token.labels),
        "fabric": dict(token.fabric),
        "max_uses": token.max_uses,
        "uses": token.uses,
        "created_at": iso(token.created_at),
        "expires_at": iso(token.expires_at),
        "last_used_at": iso(token.last_used_at),
        "revoked_at": iso(token.revoked_at),
    }


def _bad(message: str, param: str) -> Response:
    return error_response(400, message, code="invalid_join_token_request", param=param)


def _labels(body: Mapping[str, object], field: str) -> dict[str, str] | Response:
    labels = body.get(field) or {}
    if not isinstance(labels, dict) or not all(
        isinstance(k, str)
        and isinstance(v, str)
        and _LABEL_KEY.fullmatch(k)
        and len(v) <= MAX_LABEL_VALUE
        and v.isprintable()
        for k, v in labels.items()
    ):
        return _bad(
            f"{field} must be an object of label keys (letters, digits and . _ / -) to "
            f"printable strings of at most {MAX_LABEL_VALUE} characters",
            field,
        )
    return dict(labels)


def _parse_create(
    body: object,
) -> tuple[float, int | None, dict[str, str], dict[str, str]] | Response:
    if body is None:
        body = {}
    if not isinstance(body, dict):
        return _bad('send a JSON object such as {"ttl_seconds": 86400}', "body")
    unknown = sorted(set(body) - {"ttl_seconds", "max_uses", "labels", "fabric"})
    if unknown:
        return _bad(
            f"unknown field(s) {', '.join(unknown)}; use ttl_seconds, max_uses, labels, fabric",
            unknown[0],
        )
    ttl = body.get("ttl_seconds", DEFAULT_TTL_SECONDS)
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= MAX_TTL_SECONDS:
        return _bad(
            f"ttl_seconds must be a number of seconds above 0 and at most {MAX_TTL_SECONDS:.0f} "
            "(a year)",
            "ttl_seconds",
        )
    uses = body.get("max_uses")
    if uses is not None and (isinstance(uses, bool) or not isinstance(uses, int) or uses < 1):
        return _bad("max_uses must be a whole number of at least 1, or null (no limit)", "max_uses")
    labels = _labels(body, "labels")
    if isinstance(labels, Response):
        return labels
    fabric = _labels(body, "fabric")
    if isinstance(fabric, Response):
        return fabric
    return float(ttl), uses, labels, fabric


def join_token_routes(
    *,
    issuer: TokenIssuer | None,
    unavailable: str,
    wall_clock: Callable[[], datetime],
    agent_address: str = "HOST:9443",
) -> list[Route]:
    """The token routes; without `issuer` each answers 409 with `unavailable` as the reason.

    `agent_address` (where agents dial this server) goes into the `agent_command`
    a created token is answered with.
    """

    def off() -> Response:
        return error_response(409, unavailable, code="cluster_ca_off")

    async def list_tokens(_: Request) -> Response:
        if issuer is None:
            return off()
        now = wall_clock()
        try:
            tokens = await issuer.tokens()
        except StoreError as exc:
            return error_response(503, f"cannot read the join tokens: {exc}", code="store_error")
        return json_response({"tokens": [token_view(t, now) for t in tokens]})

    async def create_token(request: Request) -> Response:
        if issuer is None:
            return off()
        raw = await request.body()
        try:
            body = orjson.loads(raw) if raw.strip() else None
        except orjson.JSONDecodeError as exc:
            return error_response(400, f"the body is not valid JSON: {exc}", code="invalid_json")
        parsed = _parse_create(body)
        if isinstance(parsed, Response):
            return parsed
        ttl, uses, labels, fabric = parsed
        try:
            text, token = await issuer.create_token(
                ttl=timedelta(seconds=ttl), max_uses=uses, labels=labels, fabric=fabric
            )
        except StoreError as exc:
            return error_response(503, f"cannot store the join token: {exc}", code="store_error")
        command = f"llmgw agent --server {agent_address} --token {text}"
        return json_response(
            {**token_view(token, wall_clock()), "token": text, "agent_command": command}, 201
        )

    async def revoke_token(request: Request) -> Response:
        if issuer is None:
            return off()
        try:
            token = await issuer.revoke_token(request.path_params["token_id"])
        except NotFound as exc:
            return error_response(404, str(exc), code="join_token_not_found", param="token_id")
        except StoreError as exc:
            return error_response(503, f"cannot revoke the join token: {exc}", code="store_error")
        return json_response(token_view(token, wall_clock()))

    return [
        Route("/admin/api/join-tokens", list_tokens, methods=["GET"]),
        Route("/admin/api/join-tokens", create_token, methods=["POST"]),
        Route("/admin/api/join-tokens/{token_id}/revoke", revoke_token, methods=["POST"]),
    ]
