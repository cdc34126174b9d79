"""Who a request is made by, as the rest of the router sees it: a `Principal`.

A principal is built once per cached key (not per request) from the stored
`ApiKey`: its id and name, the models it may use, whether it is an admin key,
its `KeyLimits` for the limiter (and its team's limits and models, when it has a
team), and whether the router explains its routing to it (`may_debug`: admin
keys and keys with the `debug` scope). In open mode every request gets
`ANONYMOUS`, which may debug: without keys every client is one tenant, with
nothing to hide from the others.

A key's model list names models by any of their names: a key allowed `llama`
may call the alias `llama-chat` of the same model and the other way round. The
caller passes every name of the requested model (`names`); the principal does
not know the catalog.

Not guaranteed: that a principal is current. It is a snapshot of the key when it
was read; the authenticator replaces it when the key changes in the store.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from llmgw.auth.errors import ModelNotAllowed
from llmgw.limits import TEAM_PREFIX, KeyLimits, end_user_limits
from llmgw.store import AdminRole, ApiKey, KeyPriority


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller of one request.

    `key_id` is None in open mode. `models` None means every model. `limits` is
    None in open mode (nothing to limit) and a `KeyLimits` (possibly unlimited)
    for every key.
    """

    key_id: str | None
    name: str
    models: frozenset[str] | None
    is_admin: bool
    limits: KeyLimits | None
    # How its requests queue while a model is saturated (max_queue_wait None:
    # the router's default).
    priority: KeyPriority = "default"
    weight: float = 1.0
    max_queue_wait: float | None = None
    # Whether the router explains its choice of replica (`x-llmgw-route`) to this
    # caller: the explanation tells whether any key sent a prompt prefix lately.
    may_debug: bool = False
    # The key's role on the admin API (llmgw.auth.roles); None: a client key.
    admin_role: AdminRole | None = None
    # The key's team: its id and name, its limits (checked after the key's, on the
    # team's own counters) and the models the team may use (None: every model).
    team_id: str | None = None
    team_name: str | None = None
    team_limits: KeyLimits | None = None
    team_models: frozenset[str] | None = None
    # The limits of each end user of the key's application (None: no limit), counted
    # per (key, end user) after the key's and the team's.
    user_rpm: int | None = None
    user_tpm: int | None = None
    user_budget_tokens: int | None = None

    @property
    def limits_end_users(self) -> bool:
        """Whether the key has any end-user limit."""
        return not (
            self.user_rpm is None and self.user_tpm is None and self.user_budget_tokens is None
        )

    def end_user_limits(self, end_user: str) -> KeyLimits | None:
        """The limits of `end_user` (as the request named it) of this key; None when the
        key limits no end user (or in open mode)."""
        if self.key_id is None or not self.limits_end_users:
            return None
        return end_user_limits(
            key_id=self.key_id,
            key_name=self.name,
            end_user=end_user,
            rpm=self.user_rpm,
            tpm=self.user_tpm,
            budget_tokens=self.user_budget_tokens,
        )

    def may_use(self, model: str, names: Collection[str] = ()) -> bool:
        """True when this caller (and its team) may send requests for `model`, also
        known as `names` (the model's own name and its aliases)."""
        return _allows(self.models, model, names) and _allows(self.team_models, model, names)

    def check_model(self, model: str, names: Collection[str] = ()) -> None:
        """Raise `ModelNotAllowed` (403) unless this caller may use `model`, also
        known as `names`."""
        if not _allows(self.models, model, names):
            allowed = ", ".join(sorted(self.models or ())) or "none"
            raise ModelNotAllowed(
                f"API key {self.name!r} may not use model {model!r}; it may use: {allowed}. "
                "Ask an administrator to extend the key's models"
            )
        if not _allows(self.team_models, model, names):
            allowed = ", ".join(sorted(self.team_models or ())) or "none"
            raise ModelNotAllowed(
                f"team {self.team_name!r} (of API key {self.name!r}) may not use model "
                f"{model!r}; it may use: {allowed}. Ask an administrator to extend the "
                "team's models"
            )


def _allows(allowed: frozenset[str] | None, model: str, names: Collection[str]) -> bool:
    return allowed is None or model in allowed or not allowed.isdisjoint(names)


ANONYMOUS = Principal(
    key_id=None, name="anonymous", models=None, is_admin=False, limits=None, may_debug=True
)


def principal_for(key: ApiKey) -> Principal:
    """The principal of a stored key; `ValueError` if its stored limits are unusable."""
    limits = KeyLimits(
        key_id=key.id,
        rpm=key.rpm,
        tpm=key.tpm,
        budget_tokens=key.budget_tokens,
        budget_period=key.budget_period,
    )
    team = key.team
    team_limits = None
    if team is not None:
        team_limits = KeyLimits(
            key_id=TEAM_PREFIX + team.id,
            rpm=team.rpm,
            tpm=team.tpm,
            budget_tokens=team.budget_tokens,
            budget_period=team.budget_period,
            scope="team",
            label=team.name,
        )
    return Principal(
        key_id=key.id,
        name=key.name,
        models=frozenset(key.models) if key.models is not None else None,
        is_admin=key.is_admin,
        limits=limits,
        priority=key.priority,
        weight=key.weight,
        max_queue_wait=key.max_queue_wait,
        may_debug=key.is_admin or "debug" in key.scopes,
        admin_role=key.admin_role,
        team_id=team.id if team is not None else None,
        team_name=team.name if team is not None else None,
        team_limits=team_limits if team_limits is not None and not team_limits.unlimited else None,
        team_models=frozenset(team.models)
        if team is not None and team.models is not None
        else None,
        user_rpm=key.user_rpm,
        user_tpm=key.user_tpm,
        user_budget_tokens=key.user_budget_tokens,
    )
