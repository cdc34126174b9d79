"""`llmgw server`: the command's flags, config loading and its errors.

Heavy imports (uvicorn, the router, the store) are deferred to `llmgw.cli.gateway`,
so `llmgw --help` and config errors answer at once.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from llmgw.cli.logopts import LogFormat, setup_logging

log = logging.getLogger("llmgw.server")


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def server(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="YAML config file (listeners, endpoints, router)."),
    ] = None,
    endpoint: Annotated[
        list[str] | None,
        typer.Option(
            "--endpoint",
            "-e",
            help="A static engine: ID=URL=MODEL[,MODEL...]; repeat for more. "
            "Added to the config file's endpoints. Every route (rerank, tokenize, audio, "
            "...) is passed to it as it comes; name its engine (engine: llamacpp) or "
            "narrow its routes (routes: [...]) in the config file.",
        ),
    ] = None,
    listen: Annotated[
        str | None, typer.Option(help="API listener HOST:PORT [default: 0.0.0.0:8080].")
    ] = None,
    admin_listen: Annotated[
        str | None,
        typer.Option(
            help="Admin listener HOST:PORT; keep it on loopback [default: 127.0.0.1:9090]."
        ),
    ] = None,
    admin_allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--admin-allowed-host",
            help="A host name browsers may use to reach the admin listener and /admin on "
            "the API port, besides IP addresses, localhost and the listeners' own names "
            "(e.g. gw.example.com); repeat for more. Added to admin.allowed_hosts.",
            show_default=False,
        ),
    ] = None,
    metrics_listen: Annotated[
        str | None, typer.Option(help="Metrics-only listener HOST:PORT [default: off].")
    ] = None,
    agent_listen: Annotated[
        str | None,
        typer.Option(
            help="gRPC listener for node agents HOST:PORT, or 'off' [default: 0.0.0.0:9443].",
            show_default=False,
        ),
    ] = None,
    insecure_agents: Annotated[
        bool,
        typer.Option(
            "--insecure-agents",
            help="Plaintext agent listener without certificates (any host that reaches it can "
            "register as a node; trusted networks only) [default: off: TLS with the cluster "
            "CA, nodes join with a token].",
            show_default=False,
        ),
    ] = False,
    cluster_key_file: Annotated[
        str | None,
        typer.Option(
            envvar="LLMGW_CLUSTER_KEY_FILE",
            help="Key file that seals the cluster CA in the store; the same file on every "
            "server of a store [default: <data-dir>/cluster.key].",
            show_default=False,
        ),
    ] = None,
    data_dir: Annotated[
        str | None,
        typer.Option(
            envvar="LLMGW_DATA_DIR",
            help="Directory of the SQLite store [default: ~/.local/share/llmgw].",
            show_default=False,
        ),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(
            envvar="LLMGW_STORE",
            help="postgresql://USER@HOST/DB to share one store between servers.",
            show_default=False,
        ),
    ] = None,
    auth_mode: Annotated[
        str | None,
        typer.Option(
            help="required (every request needs an API key) or open (no keys; trusted "
            "networks only) [default: required].",
            show_default=False,
        ),
    ] = None,
    header_timeout: Annotated[
        float | None,
        typer.Option(
            help="Seconds a client has to send a request's headers before its connection "
            "is closed, on every HTTP listener (server.header_timeout) [default: 10].",
            show_default=False,
        ),
    ] = None,
    body_timeout: Annotated[
        float | None,
        typer.Option(
            help="Seconds a request body may stall before the client gets 408 and is "
            "closed (server.body_timeout) [default: 30].",
            show_default=False,
        ),
    ] = None,
    max_connections: Annotated[
        int | None,
        typer.Option(
            help="Connections each HTTP listener keeps open; more get 503 "
            "(server.max_connections) [default: 2048].",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    log_format: LogFormat = "human",
) -> None:
    """Run the gateway."""
    level = setup_logging(log_level, log_format)
    # Alembic announces each of its plugins at INFO on import; migrations still log.
    logging.getLogger("alembic.runtime.plugins").setLevel(max(level, logging.WARNING))
    from llmgw.cli.gateway import NothingToServe, StartupError, run_gateway
    from llmgw.cli.serving import ListenError, TLSFiles, bind, check_tls
    from llmgw.config import ConfigError, load_server_config, parse_endpoint_flag, parse_listen
    from llmgw.config.server import normalize_allowed_host

    try:
        overrides: dict[str, Any] = {
            "extra_endpoints": [parse_endpoint_flag(e) for e in endpoint or []]
        }
        for key, flag, value in (
            ("listen", "--listen", listen),
            ("admin_listen", "--admin-listen", admin_listen),
            ("metrics_listen", "--metrics-listen", metrics_listen),
        ):
            if value is not None:
                overrides[key] = parse_listen(flag, value)
        if agent_listen is not None:
            overrides["agent_listen"] = (
                None if agent_listen == "off" else parse_listen("--agent-listen", agent_listen)
            )
        if insecure_agents:
            overrides["insecure_agents"] = True
        if cluster_key_file is not None:
            overrides["cluster_key_file"] = cluster_key_file
        if data_dir is not None:
            overrides["data_dir"] = data_dir
        if store is not None:
            overrides["store"] = store
        for name in admin_allowed_host or []:
            try:
                normalize_allowed_host(name)
            except ValueError as exc:
                raise ConfigError(f"--admin-allowed-host {exc}") from exc
        if admin_allowed_host:
            overrides["admin_allowed_hosts"] = admin_allowed_host
        limits: dict[str, float | int | None] = {
            "header_timeout": header_timeout,
            "body_timeout": body_timeout,
            "max_connections": max_connections,
        }
        overrides.update({key: value for key, value in limits.items() if value is not None})
        if auth_mode is not None:
            if auth_mode not in ("required", "open"):
                raise ConfigError(f"--auth-mode {auth_mode!r}: use required or open")
            overrides["auth_mode"] = auth_mode
        cfg = load_server_config(config, overrides)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    from llmgw.control.catalog import CatalogError, model_from_config

    try:
        # The engine-level checks of each model (the file's shape was checked above).
        for model in cfg.models:
            model_from_config(model, source="config")
    except CatalogError as exc:
        raise _fail(f"{config}: {exc.message}") from None
    try:
        api_tls = None
        if cfg.api_tls is not None:
            api_tls = TLSFiles(cert=cfg.api_tls.cert, key=cfg.api_tls.key)
            check_tls(f"{config}: api_tls" if config else "api_tls", api_tls)
        listeners = [
            bind("API", "--listen", cfg.listen, tls=api_tls),
            bind("admin", "--admin-listen", cfg.admin_listen),
        ]
        if cfg.metrics_listen is not None:
            listeners.append(bind("metrics", "--metrics-listen", cfg.metrics_listen))
    except ListenError as exc:
        raise _fail(str(exc)) from None
    try:
        run_gateway(cfg, listeners, config_file=str(config) if config else None)
    except NothingToServe as exc:
        raise _fail(str(exc)) from None
    except StartupError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1) from None
