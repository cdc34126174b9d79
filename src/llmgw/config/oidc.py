"""Settings of single sign-on through OpenID Connect (`auth.oidc:` in the server's config).

Only the shape is checked here: that the issuer is an https URL (http only on
loopback, for a provider on the same machine), that `openid` is among the
scopes and that some group maps to a role. Whether the issuer answers, and what
the secret file holds, is checked when the server starts and at each login.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

_Group = Annotated[str, StringConstraints(min_length=1, max_length=256)]
_DOMAIN = re.compile(r"^[a-z0-9]([a-z0-9-]{0,62})(\.[a-z0-9]([a-z0-9-]{0,62}))*$")
_LOOPBACK_NAMES = frozenset({"localhost"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OidcRolesConfig(_Strict):
    """Which of the provider's groups give which admin role (llmgw.auth.roles)."""

    admins: list[_Group] = Field(
        default_factory=list,
        description="Groups whose members get the admin role (everything, keys and users too).",
    )
    operators: list[_Group] = Field(
        default_factory=list,
        description="Groups whose members get the operator role (the fleet; no keys or usage).",
    )
    viewers: list[_Group] = Field(
        default_factory=list,
        description="Groups whose members get the viewer role (read the fleet only).",
    )

    @model_validator(mode="after")
    def _some_group(self) -> OidcRolesConfig:
        if not (self.admins or self.operators or self.viewers):
            raise ValueError(
                "no group is mapped to a role, so nobody could sign in: list the provider's "
                "groups under admins, operators or viewers"
            )
        return self


def _is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class OidcConfig(_Strict):
    """An OpenID Connect provider the dashboard's users sign in with."""

    issuer: str = Field(
        description=(
            "The provider's issuer URL, exactly as its ID tokens name it in `iss` (its "
            "discovery document is read from ISSUER/.well-known/openid-configuration). "
            "https, except for a provider on loopback."
        ),
    )
    client_id: str = Field(
        min_length=1,
        max_length=256,
        description="The client id llmgw is registered under at the provider.",
    )
    client_secret_file: str = Field(
        min_length=1,
        description=(
            "A file holding the client secret (one line); a file rather than the value, "
            "so the config file can be shared and the secret kept to the server's user."
        ),
    )
    scopes: list[str] = Field(
        default_factory=lambda: ["openid", "email", "profile"],
        description=(
            "Scopes asked for; `openid` is required. Add the scope your provider needs "
            "to put groups into the ID token (e.g. `groups`)."
        ),
    )
    groups_claim: str = Field(
        default="groups",
        min_length=1,
        description="The ID token claim that lists the user's groups (a list of strings).",
    )
    allowed_domains: list[str] = Field(
        default_factory=list,
        description=(
            "E-mail domains allowed to sign in (the `email` claim's part after @, which "
            "must not be marked unverified). Empty: any user the provider accepts."
        ),
    )
    redirect_uri: str | None = Field(
        default=None,
        description=(
            "The callback URL registered at the provider. Unset: this port's own "
            "URL as the browser reached it, plus /admin/oidc/callback; set it when a "
            "reverse proxy changes the scheme or port."
        ),
    )
    roles: OidcRolesConfig = Field(
        description="Group to role mapping, re-read from the ID token at every sign-in.",
    )

    @field_validator("issuer")
    @classmethod
    def _issuer_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r} is not an https URL (e.g. https://idp.example.com)")
        if parts.query or parts.fragment:
            raise ValueError(f"{value!r}: an issuer URL has no query or fragment")
        if parts.scheme == "http" and not _is_loopback(parts.hostname):
            raise ValueError(
                f"{value!r} is plain http: use https (http is accepted only for a provider "
                "on loopback)"
            )
        return value

    @field_validator("redirect_uri")
    @classmethod
    def _redirect_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{value!r} is not an http(s) URL")
        if parts.path != "/admin/oidc/callback":
            raise ValueError(
                f"{value!r}: the callback path is /admin/oidc/callback "
                "(e.g. https://gw.example.com/admin/oidc/callback)"
            )
        return value

    @field_validator("scopes")
    @classmethod
    def _openid_scope(cls, value: list[str]) -> list[str]:
        if "openid" not in value:
            raise ValueError("must include openid (without it the provider sends no ID token)")
        for scope in value:
            if not scope or any(c.isspace() for c in scope):
                raise ValueError(f"{scope!r} is not a scope (one word each)")
        return value

    @field_validator("allowed_domains")
    @classmethod
    def _domains(cls, value: list[str]) -> list[str]:
        domains = []
        for entry in value:
            domain = entry.strip().lower().lstrip("@")
            if not _DOMAIN.match(domain):
                raise ValueError(f"{entry!r} is not an e-mail domain (e.g. example.com)")
            domains.append(domain)
        return domains
