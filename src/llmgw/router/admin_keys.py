"""Admin API for API keys and usage: `/admin/api/keys`, `/admin/api/usage` and
`/admin/api/usage/requests` (single requests' records, newest first).

The same operations as `llmgw keys` and `llmgw usage`, for tools and the
dashboard. Served on the admin listener only; `admin_guard` lets loopback
clients without a key in as admins, asks everyone else for a key with an admin
role, and lets each key do what its role may (`llmgw.auth.roles`): a key
presented on loopback is held to its role too. A created or rotated key's
secret is in that one response and nowhere else. `PATCH /admin/api/keys/{ref}`
takes any of the fields `POST /admin/api/keys` takes: a field left out stays
as it is, a field sent as `null` is cleared (models: every model; rpm, tpm,
budget_tokens: no limit; expires_at: never; scopes: none). `scopes` lists what a
key may do besides calling models: `debug` (the router explains its choice of
replica to the key, as it does to admin keys). `role` is the key's role on the
admin API: admin, operator, viewer, or null for a client key (`admin: true` is
the older way to say role admin).
Not guaranteed: pagination; the lists are whole, except request records (the
latest `limit`, 100 by default and 1000 at most; narrow them with since/until).
`team` is the team the key belongs to (its name or id; null: none).
`user_rpm`, `user_tpm` and `user_budget_tokens` (tokens per UTC day) limit each end
user of the key's application (the `user` its requests name), counted per key and
end user; null: no limit. `/admin/api/usage?by=end-user` groups usage by end user
(with `end_user=U` keeping one; only requests that named an end user count).
A row of a catalog LoRA adapter's usage says its base model (`adapter_of`).
`/admin/api/usage?by=team` groups usage by the team each key is in now, and
`team=T` keeps one team's keys; teams themselves are in `admin_teams`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from datetime import datetime
from functools import partial
from ipaddress import ip_address
from typing import Any, TypeVar, get_args

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from llmgw.auth import (
    ROLE_SCOPE_KEY,
    Authenticator,
    AuthError,
    KeyInputError,
    KeyService,
    may,
    refusal,
    token_from_headers,
)
from llmgw.auth.views import key_view
from llmgw.router.errors import error_body
from llmgw.store import (
    KEEP,
    Ambiguous,
    Conflict,
    InvalidValue,
    Keep,
    NotFound,
    StoreError,
    TeamRepository,
    UsageDimension,
    UsageRepository,
)
from llmgw.usage.views import usage_record_view, usage_row_view

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

T = TypeVar("T")

_DIMENSIONS: tuple[str, ...] = get_args(UsageDimension)
_CREATE_FIELDS = {
    "name",
    "models",
    "rpm",
    "tpm",
    "budget_tokens",
    "period",
    "expires_at",
    "admin",
    "role",
    "priority",
    "weight",
    "max_queue_wait",
    "scopes",
    "team",
    "user_rpm",
    "user_tpm",
    "user_budget_tokens",
}
# The secret is not a field: it changes only by rotating.
_UPDATE_FIELDS = _CREATE_FIELDS


class AdminInputError(Exception):
    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def _json(payload: object, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


def _error(status: int, message: str, type_: str, code: str, param: str | None = None) -> Response:
    return Response(
        error_body(message, type_, code, param), status_code=status, media_type="application/json"
    )


def _store_error(exc: StoreError) -> Response:
    if isinstance(exc, NotFound):
        return _error(404, str(exc), "invalid_request_error", "not_found")
    if isinstance(exc, Ambiguous):
        return _error(400, str(exc), "invalid_request_error", "ambiguous")
    if isinstance(exc, Conflict):
        return _error(409, str(exc), "invalid_request_error", "conflict")
    if isinstance(exc, InvalidValue):
        return _error(400, str(exc), "invalid_request_error", "invalid_request")
    return _error(503, str(exc), "service_unavailable", "store_unavailable")


async def _answer(work: Callable[[], Awaitable[Response]]) -> Response:
    """`work`'s response, or the error response for what it raised on bad input."""
    try:
        return await work()
    except orjson.JSONDecodeError as exc:
        return _error(
            400, f"request body is not valid JSON: {exc}", "invalid_request_error", "invalid_json"
        )
    except AdminInputError as exc:
        return _error(400, exc.message, "invalid_request_error", "invalid_request", exc.param)
    except KeyInputError as exc:
        return _error(400, str(exc), "invalid_request_error", "invalid_request", exc.field)
    except StoreError as exc:
        return _store_error(exc)


def _object(raw: bytes, allowed: set[str]) -> dict[str, Any]:
    """The JSON object in a request body, refusing fields not in `allowed`."""
    body = orjson.loads(raw)
    if not isinstance(body, dict):
        raise AdminInputError("the body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise AdminInputError(f"unknown field '{unknown[0]}'", param=unknown[0])
    return body


def _given(body: dict[str, Any], field: str, parse: Callable[[object], T]) -> T | Keep:
    """`body[field]` parsed, or `KEEP` when the field is absent (null is a value: clear)."""
    return parse(body[field]) if field in body else KEEP


def _new_name(value: object) -> str:
    if not isinstance(value, str):
        raise AdminInputError(
            "'name' must be a string; leave it out to keep the key's name", param="name"
        )
    return value


def _models(value: object) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
        raise AdminInputError("'models' must be an array of model names", param="models")
    return value


def _admin(value: object) -> str | None:
    if not isinstance(value, bool):
        raise AdminInputError("'admin' must be true or false", param="admin")
    return "admin" if value else None


def _role_value(value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise AdminInputError(
            "'role' must be admin, operator, viewer or null (a client key)", param="role"
        )
    return value


def _role(body: dict[str, Any]) -> str | Keep | None:
    """The key's admin role from `role`, or from the older `admin` flag (true: admin,
    false: none); `KEEP` when neither is given."""
    if "role" in body and "admin" in body:
        raise AdminInputError(
            "give either 'role' or 'admin' (true is the role admin), not both", param="role"
        )
    if "admin" in body:
        return _admin(body["admin"])
    return _given(body, "role", _role_value)


def _keep_none(value: T | Keep | None) -> T | None:
    return None if isinstance(value, Keep) else value


def _period(value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise AdminInputError("'period' must be 'day' or 'month'", param="period")
    return value


def _int(field: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise AdminInputError(f"'{field}' must be an integer", param=field)
    return value


def _scopes(value: object) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise AdminInputError(
            "'scopes' must be an array of scopes (e.g. [\"debug\"]), or [] for none",
            param="scopes",
        )
    return value


def _priority(value: object) -> str:
    if not isinstance(value, str):
        raise AdminInputError(
            "'priority' must be 'interactive', 'default' or 'batch'", param="priority"
        )
    return value


def _weight(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AdminInputError("'weight' must be a number (1: an equal share)", param="weight")
    return float(value)


def _seconds(field: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AdminInputError(f"'{field}' must be a number of seconds or null", param=field)
    return float(value)


# The most request records one /admin/api/usage/requests answer holds.
MOST_REQUESTS = 1000


def _limit(value: str | None) -> int:
    if value is None or value == "":
        return 100
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MOST_REQUESTS:
        raise AdminInputError(
            f"'limit' takes a whole number from 1 to {MOST_REQUESTS}; got {value!r}",
            param="limit",
        )
    return limit


def _time(field: str, value: object) -> datetime | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise AdminInputError(f"'{field}' must be an ISO 8601 time string", param=field)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise AdminInputError(
            f"'{field}' is not an ISO 8601 time (e.g. 2026-12-01T00:00:00Z): {value!r}",
            param=field,
        ) from exc
    if parsed.tzinfo is None:
        raise AdminInputError(f"'{field}' needs a time zone (e.g. a trailing Z)", param=field)
    return parsed


def usage_group_by(value: str) -> tuple[UsageDimension, ...]:
    """The `by` query parameter of a usage report as dimensions; `AdminInputError` naming
    the choices for anything else."""
    by = tuple(p for p in value.split(",") if p)
    for dimension in by:
        if dimension not in _DIMENSIONS:
            raise AdminInputError(
                f"'by' takes {', '.join(_DIMENSIONS)}; got {dimension!r}", param="by"
            )
    if "hour" in by and "day" in by:
        raise AdminInputError("'by' takes hour or day, not both", param="by")
    return by  # type: ignore[return-value]


def key_routes(
    *,
    service: KeyService,
    usage: UsageRepository,
    wall_clock: Callable[[], datetime],
    teams: TeamRepository | None = None,
    base_of: Callable[[str], str | None] | None = None,
) -> list[Route]:
    """`base_of(model)`: the base model of a LoRA adapter in the catalog (None for any
    other name), shown beside the adapter's usage rows as `adapter_of`."""

    def with_base(view: dict[str, Any]) -> dict[str, Any]:
        model = view.get("model")
        base = base_of(model) if base_of is not None and isinstance(model, str) else None
        return {**view, "adapter_of": base} if base is not None else view

    async def team_id(body: dict[str, Any]) -> str | Keep | None:
        """The id of the team `body["team"]` names (null: no team); KEEP when absent."""
        if "team" not in body:
            return KEEP
        ref = body["team"]
        if ref is None:
            return None
        if not isinstance(ref, str):
            raise AdminInputError("'team' must be a team's name or id, or null", param="team")
        if teams is None:
            raise AdminInputError("this server has no teams", param="team")
        return (await teams.get(ref)).id

    async def list_keys(request: Request) -> Response:
        include = request.query_params.get("all", "").lower() in ("1", "true", "yes")
        try:
            keys = await service.list(include_revoked=include)
        except StoreError as exc:
            return _store_error(exc)
        now = wall_clock()
        return _json({"keys": [key_view(k, now) for k in keys]})

    async def create_key(request: Request) -> Response:
        async def work() -> Response:
            body = _object(await request.body(), _CREATE_FIELDS)
            name = body.get("name")
            if not isinstance(name, str):
                raise AdminInputError("'name' is required and must be a string", param="name")
            key, secret = await service.create(
                team_id=_keep_none(await team_id(body)),
                name=name,
                models=_models(body.get("models")),
                rpm=_int("rpm", body.get("rpm")),
                tpm=_int("tpm", body.get("tpm")),
                budget_tokens=_int("budget_tokens", body.get("budget_tokens")),
                period=_period(body.get("period")),
                expires_at=_time("expires_at", body.get("expires_at")),
                admin_role=_keep_none(_role(body)),
                priority=_priority(body.get("priority", "default")),
                weight=_weight(body.get("weight", 1.0)),
                max_queue_wait=_seconds("max_queue_wait", body.get("max_queue_wait")),
                scopes=_scopes(body.get("scopes")),
                user_rpm=_int("user_rpm", body.get("user_rpm")),
                user_tpm=_int("user_tpm", body.get("user_tpm")),
                user_budget_tokens=_int("user_budget_tokens", body.get("user_budget_tokens")),
            )
            return _json({**key_view(key, wall_clock()), "secret": secret}, status=201)

        return await _answer(work)

    async def update_key(request: Request) -> Response:
        async def work() -> Response:
            raw = await request.body()
            body = _object(raw, _UPDATE_FIELDS | {"secret"}) if raw.strip() else {}
            if "secret" in body:
                raise AdminInputError(
                    "'secret' cannot be set; POST /admin/api/keys/{ref}/rotate gives the key "
                    "a new one",
                    param="secret",
                )
            if not body:
                raise AdminInputError(
                    "nothing to change: send at least one of "
                    + ", ".join(sorted(_UPDATE_FIELDS))
                    + " (null clears a limit)"
                )
            key = await service.update(
                request.path_params["ref"],
                name=_given(body, "name", _new_name),
                models=_given(body, "models", _models),
                rpm=_given(body, "rpm", partial(_int, "rpm")),
                tpm=_given(body, "tpm", partial(_int, "tpm")),
                budget_tokens=_given(body, "budget_tokens", partial(_int, "budget_tokens")),
                period=_given(body, "period", _period),
                expires_at=_given(body, "expires_at", partial(_time, "expires_at")),
                admin_role=_role(body),
                priority=_given(body, "priority", _priority),
                weight=_given(body, "weight", _weight),
                max_queue_wait=_given(body, "max_queue_wait", partial(_seconds, "max_queue_wait")),
                scopes=_given(body, "scopes", _scopes),
                team_id=await team_id(body),
                user_rpm=_given(body, "user_rpm", partial(_int, "user_rpm")),
                user_tpm=_given(body, "user_tpm", partial(_int, "user_tpm")),
                user_budget_tokens=_given(
                    body, "user_budget_tokens", partial(_int, "user_budget_tokens")
                ),
            )
            return _json(key_view(key, wall_clock()))

        return await _answer(work)

    async def revoke_key(request: Request) -> Response:
        async def work() -> Response:
            key = await service.revoke(request.path_params["ref"])
            return _json(key_view(key, wall_clock()))

        return await _answer(work)

    async def rotate_key(request: Request) -> Response:
        async def work() -> Response:
            key, secret = await service.rotate(request.path_params["ref"])
            return _json({**key_view(key, wall_clock()), "secret": secret})

        return await _answer(work)

    async def usage_filter(params: Mapping[str, str]) -> dict[str, Any]:
        """A usage query's key (resolved to its id), model and time window."""
        return {
            "key_id": (await service.resolve(params["key"])).id if params.get("key") else None,
            "model": params.get("model") or None,
            "since": _time("since", params.get("since")),
            "until": _time("until", params.get("until")),
        }

    def end_user_filter(params: Mapping[str, str]) -> dict[str, Any]:
        return {"end_user": params["end_user"]} if params.get("end_user") else {}

    async def key_names() -> dict[str, str]:
        return {k.id: k.name for k in await service.list(include_revoked=True)}

    async def usage_report(request: Request) -> Response:
        async def work() -> Response:
            params = request.query_params
            group_by = usage_group_by(params.get("by", "key,model"))
            team_id = None
            if params.get("team") and teams is not None:
                team_id = (await teams.get(params["team"])).id
            rows = await usage.query(
                **await usage_filter(params),
                **end_user_filter(params),
                group_by=group_by,
                team_id=team_id,
            )
            names = await key_names()
            team_names = (
                {t.id: t.name for t in await teams.list()}
                if teams is not None and "team" in group_by
                else {}
            )
            return _json(
                {"usage": [with_base(usage_row_view(r, group_by, names, team_names)) for r in rows]}
            )

        return await _answer(work)

    async def usage_requests(request: Request) -> Response:
        async def work() -> Response:
            params = request.query_params
            limit = _limit(params.get("limit"))
            records = await usage.requests(**await usage_filter(params), limit=limit)
            names = await key_names()
            return _json({"requests": [usage_record_view(r, names) for r in records]})

        return await _answer(work)

    return [
        Route("/admin/api/keys", list_keys, methods=["GET"]),
        Route("/admin/api/keys", create_key, methods=["POST"]),
        Route("/admin/api/keys/{ref}", update_key, methods=["PATCH"]),
        Route("/admin/api/keys/{ref}/revoke", revoke_key, methods=["POST"]),
        Route("/admin/api/keys/{ref}/rotate", rotate_key, methods=["POST"]),
        Route("/admin/api/usage", usage_report, methods=["GET"]),
        Route("/admin/api/usage/requests", usage_requests, methods=["GET"]),
    ]


def _is_loopback(scope: Scope) -> bool:
    client = scope.get("client")
    if not client:
        return False
    try:
        return ip_address(client[0]).is_loopback
    except ValueError:
        return False


def admin_guard(app: ASGIApp, *, authenticator: Authenticator) -> ASGIApp:
    """Loopback clients without a key pass as admins; a request with a key (from
    anywhere) passes when the key's role may make it, and carries that role in the
    scope (`ROLE_SCOPE_KEY`) for the dashboard."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        token = token_from_headers(headers.get(b"authorization"), headers.get(b"x-api-key"))
        if token is None and _is_loopback(scope):
            await app(scope, receive, send)
            return
        try:
            principal = await authenticator.authenticate(token)
        except AuthError as exc:
            response = _error(exc.status, exc.message, exc.type, exc.code)
        else:
            role, method, path = principal.admin_role, scope["method"], scope["path"]
            if principal.key_id is None and _is_loopback(scope):
                # Auth mode open: there are no keys to hold a loopback caller to.
                role = "admin"
            if role is not None and may(role, method, path):
                scope[ROLE_SCOPE_KEY] = role
                await app(scope, receive, send)
                return
            if role is None:
                response = _error(
                    403,
                    f"API key {principal.name!r} has no admin role: the admin API needs a key "
                    "with one (llmgw keys create --role admin|operator|viewer)",
                    "permission_error",
                    "admin_required",
                )
            else:
                response = _error(
                    403,
                    refusal(f"API key {principal.name!r}", role, method, path),
                    "permission_error",
                    "role_not_allowed",
                )
        await response(scope, receive, send)

    return guarded
