"""Building single sign-on from `auth.oidc`: the client secret, the HTTP client, the service.

The secret file is read once at start-up, so a missing or empty file stops the
server with a message naming the field and the file, rather than failing the
first person who signs in. The provider itself is not contacted here: a
provider that is down at start-up must not keep the gateway from serving, and
its discovery document is fetched at the first sign-in.

Not guaranteed: that a changed secret file is noticed; restart the server.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from authlib.integrations.httpx_client import AsyncOAuth2Client

from llmgw.auth.oidc import ProviderMetadata, SingleSignOn, SsoSettings
from llmgw.config import ServerConfig
from llmgw.config.oidc import OidcConfig
from llmgw.store import Store

# Seconds any one call to the provider (discovery, keys, token) may take.
PROVIDER_TIMEOUT = 10.0


class SsoSetupError(Exception):
    """`auth.oidc` cannot be used as configured; the message names the field and file."""


def read_client_secret(oidc: OidcConfig, config_file: str | None) -> str:
    """The client secret from `auth.oidc.client_secret_file`; `SsoSetupError` saying why not."""
    where = f"{config_file}: auth.oidc.client_secret_file" if config_file else "auth.oidc"
    path = Path(oidc.client_secret_file).expanduser()
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError as exc:
        raise SsoSetupError(
            f"{where}: {path} does not exist; write the client secret your identity "
            "provider gave llmgw into it (one line, readable by this server only)"
        ) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise SsoSetupError(f"{where}: cannot read {path}: {exc}") from exc
    if not secret or "\n" in secret:
        raise SsoSetupError(f"{where}: {path} must hold the client secret on one line")
    return secret


def open_sso_client(cfg: ServerConfig, config_file: str | None) -> AsyncOAuth2Client | None:
    """The HTTP client that talks to the provider (None without `auth.oidc`); the caller
    closes it with `aclose()`."""
    oidc = cfg.auth.oidc
    if oidc is None:
        return None
    return AsyncOAuth2Client(
        client_id=oidc.client_id,
        client_secret=read_client_secret(oidc, config_file),
        code_challenge_method="S256",
        token_endpoint_auth_method="client_secret_basic",
        timeout=PROVIDER_TIMEOUT,
    )


def build_sso(
    cfg: ServerConfig,
    *,
    client: AsyncOAuth2Client,
    store: Store,
    clock: Callable[[], float],
    wall_clock: Callable[[], datetime],
) -> SingleSignOn:
    """Single sign-on over `client` (from `open_sso_client`) and the store."""
    oidc = cfg.auth.oidc
    assert oidc is not None
    settings = SsoSettings(
        issuer=oidc.issuer,
        client_id=oidc.client_id,
        scopes=tuple(oidc.scopes),
        groups_claim=oidc.groups_claim,
        allowed_domains=tuple(oidc.allowed_domains),
        roles={
            "admin": tuple(oidc.roles.admins),
            "operator": tuple(oidc.roles.operators),
            "viewer": tuple(oidc.roles.viewers),
        },
        redirect_uri=oidc.redirect_uri,
    )
    return SingleSignOn(
        settings=settings,
        client=client,
        provider=ProviderMetadata(client=client, issuer=oidc.issuer, clock=clock),
        logins=store.oidc_logins,
        users=store.users,
        wall_clock=wall_clock,
    )
