"""The gateway process's composition root: every long-lived object is built here.

The metrics registry, endpoint pool, upstream client, prober, proxy and apps are
constructed here and handed to each other as keyword arguments. Shutdown order
on SIGTERM/SIGINT: stop accepting, let in-flight requests finish (up to the
grace period), cancel background loops, close the upstream pool.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import secrets
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Executor, ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import uvloop
from authlib.integrations.httpx_client import AsyncOAuth2Client
from prometheus_client import CollectorRegistry

from llmgw import __version__
from llmgw.auth import (
    Authenticator,
    KeyAuthenticator,
    KeyService,
    OpenAuthenticator,
    Passwords,
    TeamAccess,
)
from llmgw.cli.cluster_wiring import (
    ClusterSetupError,
    agent_listener_view,
    agent_security,
    announce_join,
    dialable,
    open_cluster_pki,
    reserved_node_names,
    tokens_unavailable,
)
from llmgw.cli.control_wiring import ControllerActivator, PoolPublisher, static_spec
from llmgw.cli.dashboard_wiring import dashboard_sources
from llmgw.cli.listener_guard import ConnectionGate
from llmgw.cli.serving import (
    BoundListener,
    QuietServer,
    make_server,
    raise_open_files_limit,
    tune_garbage_collector,
)
from llmgw.cli.sso_wiring import SsoSetupError, build_sso, open_sso_client
from llmgw.config import ListenAddress, ServerConfig
from llmgw.config.routing import ScorerWeights
from llmgw.control.adminapi import (
    config_routes,
    event_routes,
    model_routes,
    node_routes,
    node_view,
)
from llmgw.control.adminapi.tokens import join_token_routes
from llmgw.control.agentsvc import (
    AgentListener,
    AgentListenerError,
    AgentServicer,
    ClaimBatcher,
    NodeRemoval,
    RegistrationPacer,
    run_sweeper,
    serve_agents,
)
from llmgw.control.agentsvc.cluster_pki import ClusterPki, ClusterPkiError
from llmgw.control.agentsvc.join import serve_cluster_agents
from llmgw.control.catalog import Catalog, CatalogError
from llmgw.control.catalog.hub import HubRevisions
from llmgw.control.catalog.reload import ConfigReloader, ConfigSource, InvalidConfig, config_models
from llmgw.control.inventory import FleetMetrics, Inventory
from llmgw.control.leadership import (
    LEASE_NAME,
    FleetView,
    LeaderMetrics,
    Leadership,
    ServerDirectory,
    StorePublisher,
    follow_endpoints,
    leader_routes,
    publish_fleet,
    published,
    sync_demand,
)
from llmgw.control.placements import PlacementBook
from llmgw.control.reachability import ReachabilityGate, tcp_probe
from llmgw.control.reconciler.controller import Controller
from llmgw.control.reconciler.pulls import WeightsPuller
from llmgw.control.reconciler.views import ModelControlService
from llmgw.diagnostics import AllocationTracer, Profiler
from llmgw.lifecycle import guard
from llmgw.limits import Limiter, LimitMetrics
from llmgw.metrics import MetricsHistory, RouterMetrics
from llmgw.metrics.activations import ActivationMetrics
from llmgw.metrics.certs import CertificateMetrics, CertificateSource, certificate_file
from llmgw.metrics.listeners import ListenerMetrics
from llmgw.metrics.queue import QueueMetrics
from llmgw.metrics.routing import RoutingMetrics
from llmgw.router.access_log import AccessLog
from llmgw.router.admin import create_admin_app, create_metrics_app
from llmgw.router.admin_keys import admin_guard, key_routes
from llmgw.router.admin_teams import team_routes
from llmgw.router.apis.count_tokens import TokenCounter
from llmgw.router.app import RouterApp
from llmgw.router.balancer import Balancer, build_scorers
from llmgw.router.browser_guard import browser_guard
from llmgw.router.continuation import Continuation
from llmgw.router.debug import debug_paths, debug_routes
from llmgw.router.endpoints import EjectionPolicy, EndpointPool
from llmgw.router.engine_load import EngineLoadScraper
from llmgw.router.flow_share import FlowShare
from llmgw.router.health import HealthProber
from llmgw.router.load_report import LoadReport
from llmgw.router.proxy import Proxy
from llmgw.router.queue import RequestQueue
from llmgw.router.saturation import Saturation
from llmgw.router.scoring.load import LoadBook
from llmgw.router.scoring.prefix import PrefixIndex
from llmgw.router.scoring.share import PrefixShare
from llmgw.router.scoring.ttft import TtftPredictor
from llmgw.router.shares import ShareLedger
from llmgw.router.upstream import Upstream
from llmgw.store import ControlServer, Store, StoreError, open_store, store_url, utc_now
from llmgw.telemetry.tracing import Tracing, TracingError, build_tracing
from llmgw.usage import RecordedUsage, RetentionPruner, UsageRecorder
from llmgw.web import create_admin_portal, create_dashboard_routes
from llmgw.web.portal import FORM_PATHS, SECRET_READS
from llmgw.web.sources import TeamPageSources

log = logging.getLogger("llmgw.server")

GRACE_SECONDS = 30.0


DEFAULT_DATA_DIR = "~/.local/share/llmgw"
PRUNE_INTERVAL = 3600.0
AGENT_COMMAND_TIMEOUT = (
    30.0  # how long a node gets to answer a command (stop/drain add their grace)
)
SWEEP_INTERVAL = 1.0
AGENT_STOP_GRACE = 5.0
# Engines (uvicorn) drop idle keep-alive connections after 5 s; ours retire sooner.
UPSTREAM_IDLE_SECONDS = 4.0
# A standby reads the leader's published endpoints this often.
FOLLOW_INTERVAL = 0.5
# The leader writes its view of the nodes for standbys this often (changed nodes only).
FLEET_INTERVAL = 1.0
# Demand (requests, activity) is shared through the store this often.
DEMAND_INTERVAL = 1.0
# Models added through another server's admin API are seen within this long.
CATALOG_POLL_INTERVAL = 2.0
# A replica this server cannot dial is dialled again this often (cheap: a TCP connect).
REACH_RECHECK_SECONDS = 2.0
# Threads that hash login passwords (argon2id, 64 MiB each): two bound the memory
# and CPU a flood of logins can take; a person logging in waits ~100 ms.
LOGIN_HASH_THREADS = 2
LOGIN_THREAD_PREFIX = "llmgw-login"
# Logins waiting for those threads before more are answered 503.
LOGIN_HASH_WAITING = 32
# Open files besides the listeners' connections: the store, logs, the agent
# listener's streams, probes.
FILES_BESIDES_CONNECTIONS = 512


async def _lead(
    epoch: int,
    controller: Controller,
    publisher: StorePublisher,
    store: Store,
    agents: AgentServicer,
    placements: PlacementBook,
    fleet: Callable[[int], Awaitable[None]],
    puller: WeightsPuller,
) -> None:
    """The leader-only tasks of one term; cancelled when the lease is lost."""
    try:
        # Before anything else: agents' reports are judged against these records,
        # and Registers wait until they are read.
        await placements.start_term(epoch)
        try:
            expected = await published(store.leadership)
        except StoreError as exc:
            log.warning("cannot read what the previous leader published: %s", exc)
            expected = {}
        async with asyncio.TaskGroup() as group:
            group.create_task(guard("reconciler", controller.run(expected=expected)))
            group.create_task(guard("endpoint publisher", publisher.run(epoch)))
            group.create_task(guard("placement records", placements.run()))
            group.create_task(guard("fleet publisher", fleet(epoch)))
            group.create_task(guard("weights prefetch", puller.run()))
    finally:
        # Agents must move to the new leader: a standby holding their streams
        # would keep nodes the leader cannot command.
        await agents.close_all("this server no longer leads the control plane")
        placements.end_term()


async def _follow(*loops: Coroutine[Any, Any, None]) -> None:
    """A standby's loops (the leader's endpoints, its nodes), run together until the
    standby leads and cancels them."""
    async with asyncio.TaskGroup() as group:
        for loop in loops:
            group.create_task(loop)


async def _poll_catalog(catalog: Catalog) -> None:
    """Models added or removed through another server's admin API come into force here."""
    while True:
        await asyncio.sleep(CATALOG_POLL_INTERVAL)
        try:
            await catalog.load()
        except (CatalogError, StoreError) as exc:
            log.warning("cannot reload the catalog from the store (keeping it): %s", exc)


async def _reload_on_hangup(reloader: ConfigReloader, hangup: asyncio.Event) -> None:
    """SIGHUP reloads the config file's models (as `llmgw models reload` does); the
    outcome goes to the log, a refused file with the field at fault."""
    while True:
        await hangup.wait()
        hangup.clear()
        try:
            done = await reloader.reload()
        except (CatalogError, StoreError) as exc:
            log.error("SIGHUP: the config file was not reloaded: %s", exc)
            continue
        view = done.view()
        log.info(
            "SIGHUP: reloaded the models of %s: added %s, changed %s (rolling %s), removed %s%s",
            done.file,
            view["added"] or "none",
            view["changed"] or "none",
            view["rolled"] or "none",
            view["removed"] or "none",
            f"; needs a restart to apply: {', '.join(done.restart_needed)}"
            if done.restart_needed
            else "",
        )


def _agent_address(cfg: ServerConfig) -> str:
    """Where agents reach this server, for standbys to name when they refuse an agent."""
    if cfg.control.advertise_agent_address:
        return cfg.control.advertise_agent_address
    if cfg.agent_listen is None:
        return ""
    return _reachable(cfg.agent_listen.host, cfg.agent_listen.port)


def _reachable(host: str, port: int) -> str:
    """`host:port` as others dial it: this host's name for a wildcard address."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _own_names(address: ListenAddress, allowed: list[str]) -> set[str]:
    """The names browsers may use in `Host` for a listener: the configured
    `admin.allowed_hosts`, and the listener's own host, or this host's names
    when it listens on every address."""
    names = {name.lower() for name in allowed}
    if address.host in ("0.0.0.0", "::", ""):
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    else:
        names.add(address.host.lower())
    return names


def _api_url(cfg: ServerConfig) -> str:
    """Where clients reach this server's API, as the server list shows it."""
    scheme = "https" if cfg.api_tls is not None else "http"
    return f"{scheme}://{_reachable(cfg.listen.host, cfg.listen.port)}"


class StartupError(Exception):
    """The gateway cannot start; the message says why and what to do."""


class NothingToServe(StartupError):
    """No endpoints and no catalog models: a usage error, not a failure."""


async def _load_catalog(cfg: ServerConfig, store: Store, config_file: str | None) -> Catalog:
    """The catalog from the config file plus the store; stored models that no
    longer validate are skipped with a warning rather than stopping the server."""
    revisions = HubRevisions(environ=os.environ)
    try:
        models = await config_models(cfg, label=config_file or "the config", revisions=revisions)
    except InvalidConfig as exc:
        raise StartupError(f"{exc.message}; fix the model and start again") from exc
    try:
        catalog = Catalog(
            repo=store.catalog,
            config_models=models,
            config_file=config_file,
            revisions=revisions,
        )
        warnings = await catalog.load()
    except (CatalogError, StoreError) as exc:
        raise StartupError(f"cannot load the model catalog: {exc}") from exc
    for warning in warnings:
        log.warning("%s", warning)
    return catalog


def run_gateway(
    cfg: ServerConfig,
    listeners: list[BoundListener],
    *,
    config_file: str | None = None,
    reload_source: ConfigSource | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully. SIGHUP (and the admin
    API's reload) reads `reload_source` again, by default the config file."""
    if reload_source is None and config_file is not None:
        reload_source = ConfigSource.file(Path(config_file))
    try:
        url = store_url(Path(cfg.data_dir or DEFAULT_DATA_DIR).expanduser(), cfg.store)
    except StoreError as exc:
        raise StartupError(str(exc)) from exc
    short = raise_open_files_limit(
        2 * cfg.server.max_connections * len(listeners) + FILES_BESIDES_CONNECTIONS
    )
    if short is not None:
        log.warning("%s", short)
    uvloop.run(_run(cfg, listeners, url, config_file, reload_source))


async def _open_store(url: str) -> Store:
    try:
        store = await open_store(url)
    except StoreError as exc:
        raise StartupError(f"cannot open the store: {exc}") from exc
    try:
        await store.upgrade()
    except StoreError as exc:
        await store.close()
        raise StartupError(f"cannot migrate the store {store.url}: {exc}") from exc
    return store


async def _run(
    cfg: ServerConfig,
    listeners: list[BoundListener],
    url: str,
    config_file: str | None,
    reload_source: ConfigSource | None,
) -> None:
    try:
        tracing = build_tracing(cfg.telemetry, service="llmgw-server")
    except TracingError as exc:
        raise StartupError(str(exc)) from exc
    if tracing is not None:
        log.info("tracing: spans go to %s (OTLP/HTTP)", tracing.endpoint)
    try:
        sso_client = open_sso_client(cfg, config_file)
    except SsoSetupError as exc:
        raise StartupError(str(exc)) from exc
    store = await _open_store(url)
    # Logins hash passwords here, never in the default executor the rest shares.
    login_pool = ThreadPoolExecutor(
        max_workers=LOGIN_HASH_THREADS, thread_name_prefix=LOGIN_THREAD_PREFIX
    )
    try:
        await _serve(
            cfg,
            listeners,
            store,
            config_file,
            reload_source,
            login_pool=login_pool,
            tracing=tracing,
            sso_client=sso_client,
        )
    finally:
        if sso_client is not None:
            await sso_client.aclose()
        login_pool.shutdown(wait=False, cancel_futures=True)
        await store.close()
        if tracing is not None:
            # Blocking (bounded): the exporter sends what is queued.
            await asyncio.to_thread(tracing.shutdown)


def _certificates(cfg: ServerConfig, pki: ClusterPki | None) -> list[CertificateSource]:
    """Where the certificate expiry metric reads this server's certificates."""
    sources: list[CertificateSource] = []
    if pki is not None:
        cluster = pki

        def cluster_certs() -> list[tuple[str, datetime]]:
            try:
                return [
                    ("cluster-ca", cluster.ca_certificate.not_valid_after_utc),
                    ("agent-listener", cluster.server_certificate.not_valid_after_utc),
                ]
            except ClusterPkiError:
                return []  # not open yet

        sources.append(cluster_certs)
    if cfg.api_tls is not None:
        sources.append(certificate_file("api-listener", cfg.api_tls.cert))
    if cfg.agent_tls is not None:
        sources.append(certificate_file("agent-listener", cfg.agent_tls.cert))
        sources.append(certificate_file("agent-ca", cfg.agent_tls.ca))
    return sources


def _model_names(catalog: Catalog, name: str) -> tuple[str, ...]:
    """Every name of the model or adapter `name` stands for in the catalog (just `name`
    if none)."""
    model = catalog.entry(name)
    return model.names if model is not None else (name,)


def _base_of(catalog: Catalog, name: str) -> str | None:
    """The base model of catalog adapter `name` (None: not an adapter in the catalog now)."""
    entry = catalog.entry(name)
    return entry.adapter_of if entry is not None else None


def _routing_weights(catalog: Catalog, name: str) -> ScorerWeights | None:
    """The catalog model's own scorer weights (None: not a catalog model, or unset)."""
    model = catalog.get(name)
    return model.routing if model is not None else None


def _max_in_flight(catalog: Catalog, name: str) -> int | None:
    """The catalog model's own max_in_flight, an adapter's base's (its requests run on
    the base's replicas); None: not in the catalog, or unset."""
    entry = catalog.entry(name)
    if entry is not None and entry.adapter_of is not None:
        entry = catalog.get(entry.adapter_of)
    return entry.max_in_flight if entry is not None else None


def _target_in_flight(catalog: Catalog, name: str) -> int | None:
    """The catalog model's target_in_flight (None: not a catalog model, or unset)."""
    model = catalog.get(name)
    return model.target_in_flight if model is not None else None


async def _serve(
    cfg: ServerConfig,
    listeners: list[BoundListener],
    store: Store,
    config_file: str | None,
    reload_source: ConfigSource | None,
    *,
    login_pool: Executor,
    tracing: Tracing | None = None,
    sso_client: AsyncOAuth2Client | None = None,
) -> None:
    loop = asyncio.get_running_loop()
    router_tracer = tracing.tracer("llmgw.router") if tracing is not None else None
    control_tracer = tracing.tracer("llmgw.control") if tracing is not None else None
    clock = loop.time
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry=registry)
    listener_metrics = ListenerMetrics(registry=registry)
    health = cfg.router.health
    pool = EndpointPool(
        policy=EjectionPolicy(health.failure_threshold, health.ejection_base, health.ejection_max),
        clock=clock,
        on_forget=metrics.retain_endpoints,
    )
    publisher = PoolPublisher(
        sink=pool,
        static=[static_spec(e) for e in cfg.endpoints],
    )
    publisher.publish_static()
    catalog = await _load_catalog(cfg, store, config_file)
    reloader = ConfigReloader(catalog=catalog, source=reload_source)
    await reloader.start()
    if not cfg.endpoints and not catalog.models():
        raise NothingToServe(
            "nothing to serve: add an engine with --endpoint ID=URL=MODEL "
            "(e.g. --endpoint gpu1=http://127.0.0.1:8000=llama-3-8b), an `endpoints:` list "
            "or a `models:` catalog in the file given to --config"
        )
    metrics.watch_endpoints(pool.snapshots)
    timeouts = cfg.router.timeouts
    upstream = Upstream(connect_timeout=timeouts.connect, idle_timeout=UPSTREAM_IDLE_SECONDS)
    inventory = Inventory(
        clock=clock,
        wall_clock=utc_now,
        unreachable_after=cfg.control.unreachable_after,
        lost_after=cfg.control.lost_after,
    )
    FleetMetrics(registry=registry, inventory=inventory)
    server_id = f"{socket.gethostname()}:{os.getpid()}"
    security = agent_security(cfg)
    pki: ClusterPki | None = None
    if security == "cluster":
        try:
            pki = await open_cluster_pki(
                cfg,
                store,
                data_dir=cfg.data_dir or DEFAULT_DATA_DIR,
                server_id=server_id,
                wall_clock=utc_now,
            )
        except ClusterSetupError as exc:
            raise StartupError(str(exc)) from exc
    leadership = Leadership(
        store=store.lease,
        server_id=server_id,
        agent_address=_agent_address(cfg),
        ttl=cfg.control.lease_ttl,
        clock=clock,
        wall_clock=utc_now,
    )
    started = utc_now()
    directory = ServerDirectory(
        store=store.leadership,
        server=ControlServer(
            server=server_id,
            hostname=socket.gethostname(),
            version=__version__,
            api_url=_api_url(cfg),
            agent_address=_agent_address(cfg),
            started_at=started,
            last_seen=started,
        ),
        leading=leadership.is_leader,
        wall_clock=utc_now,
        interval=cfg.control.lease_ttl / 3,
    )
    LeaderMetrics(
        registry=registry,
        leadership=leadership,
        servers=directory.latest,
        wall_clock=utc_now,
        ttl=cfg.control.lease_ttl,
    )
    # This server dials every replica before its router may use it (each server
    # for itself: the store carries the leader's whole view, unchecked).
    gate = ReachabilityGate(
        local=publisher,
        probe=lambda url: tcp_probe(url, seconds=timeouts.connect),
        clock=clock,
        wall_clock=utc_now,
        recheck_interval=REACH_RECHECK_SECONDS,
    )
    store_publisher = StorePublisher(
        local=gate, store=store.leadership, lease_name=LEASE_NAME, on_fenced=leadership.lost
    )
    placements = PlacementBook(
        store=store.placements, lease_name=LEASE_NAME, on_fenced=leadership.lost
    )
    agents = AgentServicer(
        inventory=inventory,
        placements=placements,
        stop_grace=cfg.control.stop_grace,
        heartbeat_interval=cfg.control.heartbeat_interval,
        heartbeat_scale_above=cfg.control.heartbeat_scale_above,
        leader_id=server_id,
        server_version=__version__,
        command_timeout=AGENT_COMMAND_TIMEOUT,
        registry=registry,
        require_identity=security in ("own", "cluster"),
        admission=leadership.admission,
        # One transaction for the node-id claims of Registers arriving together.
        identities=ClaimBatcher(store=store.nodeids),
        # Late-bound: the controller, which keeps the events, is built next.
        record_event=lambda node_id, message: controller.note("node", node_id, message),
        reserved_names=await reserved_node_names(cfg, pki),
        wall_clock=utc_now,
        tracer=control_tracer,
        pacer=RegistrationPacer(
            rate=cfg.control.registrations_per_second,
            burst=cfg.control.registration_burst,
            clock=clock,
            rng=random.Random(),
        ),
    )
    control = cfg.control
    controller = Controller(
        catalog=catalog,
        inventory=inventory,
        dispatcher=agents,
        placements=placements,
        publisher=store_publisher,
        clock=clock,
        wall_clock=utc_now,
        policy=control.placement,
        interval=control.reconcile_interval,
        retry_base=control.retry_base,
        retry_max=control.retry_max,
        activation_timeout=control.activation_timeout,
        stop_grace=control.stop_grace,
        # Agents reconnect within about one unreachable window after a restart.
        startup_grace=control.unreachable_after,
        # Replicas Ready under the previous leader are given up like a lost node's.
        adoption_grace=control.lost_after,
        leading=leadership.is_leader,
        # A node that stops answering: requests waiting on its engines go elsewhere.
        abandon=pool.abandon,
        mgmt_interface=control.mgmt_interface,
        # Late-bound: the router's load report is built with its queue, below.
        router_load=lambda: load_report.models(),  # noqa: PLW0108
        tracer=control_tracer,
        activation_metrics=ActivationMetrics(registry=registry),
        rollouts=store.rollouts,
        canary_halts=store.canary_halts,
        routed=lambda replica_id: _routed(gate, replica_id),
    )
    CertificateMetrics(registry=registry, sources=_certificates(cfg, pki))
    routing = cfg.router.routing
    routing_metrics = RoutingMetrics(registry=registry)
    # Engine load reports older than a few reads are ignored (the router's own counts stand).
    load_book = LoadBook(clock=clock, stale_after=5 * routing.metrics_interval)
    prefix_index = PrefixIndex(capacity=routing.index_blocks, ttl=routing.index_ttl, clock=clock)
    # Late-bound: the batch size of last resort is the replica's max_in_flight,
    # which the saturation detector below knows.
    predictor = TtftPredictor(
        config=routing.ttft,
        book=load_book,
        key_blocks=routing.rendezvous_blocks,
        limit=lambda endpoint, name: saturation.limit(endpoint, name),  # noqa: PLW0108
        metrics=routing_metrics,
        rng=random.Random(),
    )
    engine_loads = EngineLoadScraper(
        pool=pool,
        upstream=upstream,
        book=load_book,
        interval=routing.metrics_interval,
        timeout=health.timeout,
        clock=clock,
        metrics=routing_metrics,
        forget=(predictor.refresh, prefix_index.keep_only),
    )
    queue_reads_load = (
        cfg.router.queue.max_waiting is not None or cfg.router.queue.max_kv_cache is not None
    )
    saturation = Saturation(
        pool=pool,
        clock=clock,
        default_limit=cfg.router.max_in_flight,
        endpoint_limits={e.id: e.max_in_flight for e in cfg.endpoints if e.max_in_flight},
        model_limit=lambda name: _max_in_flight(catalog, name),
        max_waiting=cfg.router.queue.max_waiting,
        max_kv_cache=cfg.router.queue.max_kv_cache,
        load=load_book if queue_reads_load else None,
    )
    # Routers sharing a Redis count fair shares together; alone, a router's queue
    # orders by its own start-time fair queuing.
    ledger = (
        ShareLedger(
            wall_clock=time.time,
            window=cfg.router.queue.share_window,
            interval=cfg.router.queue.recheck,
            redis_url=cfg.limits.redis_url,
        )
        if cfg.limits.redis_url is not None
        else None
    )
    # ... and the reserve counts every router's requests. The id is new per process
    # (a restarted router's counts are its own); what a stopped one published
    # expires after a few syncs.
    flow_share = (
        FlowShare(
            redis_url=cfg.limits.redis_url,
            router_id=f"{server_id}:{secrets.token_hex(4)}",
            interval=cfg.router.queue.recheck,
            expire_after=3 * cfg.router.queue.recheck + 1.0,
        )
        if cfg.limits.redis_url is not None and cfg.router.queue.reserve > 0
        else None
    )
    request_queue = RequestQueue(
        ledger=ledger,
        flow_share=flow_share,
        saturation=saturation,
        clock=clock,
        max_size=cfg.router.queue.max_size,
        aging=cfg.router.queue.aging,
        recheck=cfg.router.queue.recheck,
        retry_after=cfg.router.retry_after,
        metrics=QueueMetrics(registry=registry),
        share=cfg.router.queue.share,
        reserve=cfg.router.queue.reserve,
        active_for=cfg.router.queue.share_window,
    )
    load_report = LoadReport(
        pool=pool, book=load_book, queue=request_queue, clock=clock, wall_clock=utc_now
    )
    # Routers sharing a Redis learn each other's placements; alone, each learns its own.
    prefix_share = (
        PrefixShare(
            redis_url=routing.redis_url,
            channel=routing.share_channel,
            interval=routing.share_interval,
            metrics=routing_metrics,
        )
        if routing.redis_url is not None
        else None
    )
    balancer = Balancer(
        clock=clock,
        rng=random.Random(),
        routing=routing,
        scorers=build_scorers(routing, book=load_book, clock=clock, index=prefix_index),
        index=prefix_index,
        publish=prefix_share.note if prefix_share is not None else None,
        predictor=predictor,
        book=load_book,
        metrics=routing_metrics,
        model_weights=lambda name: _routing_weights(catalog, name),
        # Load wins over affinity on a replica at the load its model is scaled for.
        capacity=lambda endpoint, name: (
            _target_in_flight(catalog, name),
            saturation.limit(endpoint, name),
        ),
    )
    activator = ControllerActivator(controller=controller, gate=gate)
    continuation = Continuation(
        pool=pool,
        balancer=balancer,
        upstream=upstream,
        metrics=metrics,
        config=cfg.router.continuation,
        clock=clock,
        first_byte=cfg.router.timeouts.first_byte,
        idle=cfg.router.timeouts.idle,
        keepalive=control.activation_keepalive,
        wait_limit=control.activation_timeout,
        activator=activator,
        tracer=router_tracer,
    )
    proxy = Proxy(
        queue=request_queue,
        saturation=saturation,
        pool=pool,
        balancer=balancer,
        upstream=upstream,
        metrics=metrics,
        config=cfg.router,
        clock=clock,
        activator=activator,
        activation_keepalive=control.activation_keepalive,
        activation_timeout=control.activation_timeout,
        tracer=router_tracer,
        continuation=continuation,
    )
    prober = HealthProber(
        pool=pool, upstream=upstream, interval=health.interval, timeout=health.timeout
    )
    authenticator: Authenticator
    key_authenticator: KeyAuthenticator | None = None
    if cfg.auth.mode == "open":
        authenticator = OpenAuthenticator()
        log.warning(
            "AUTH IS OFF (auth.mode: open): anyone who can reach %s may use every model "
            "without a key; use this on a trusted network only",
            cfg.listen,
        )
    else:
        authenticator = key_authenticator = KeyAuthenticator(
            keys=store.keys,
            clock=clock,
            wall_clock=utc_now,
            refresh_interval=cfg.auth.refresh_interval,
        )
    usage = UsageRecorder(
        repo=store.usage,
        registry=registry,
        queue_size=cfg.usage.queue_size,
        batch_size=cfg.usage.batch_size,
        flush_interval=cfg.usage.flush_interval,
        base_of=lambda name: _base_of(catalog, name),
    )
    limiter = Limiter(
        clock=clock,
        wall_clock=utc_now,
        # Budgets count tokens whose usage records are not in the store (yet, or ever).
        budget_source=RecordedUsage(stored=store.usage, unwritten=usage),
        redis_url=cfg.limits.redis_url,
        metrics=LimitMetrics(registry=registry),
    )
    pruner = RetentionPruner(
        repo=store.usage,
        retention=timedelta(days=cfg.usage.retention_days),
        interval=PRUNE_INTERVAL,
        wall_clock=utc_now,
    )
    model_control = ModelControlService(controller=controller, reach=gate)
    puller = WeightsPuller(
        catalog=catalog,
        inventory=inventory,
        dispatcher=agents,
        clock=clock,
        policy=control.placement,
        mgmt_interface=control.mgmt_interface,
        interval=control.reconcile_interval,
        retry_after=control.retry_max,
        leading=leadership.is_leader,
        leader=lambda: leadership.info().leader,
    )
    key_service = KeyService(keys=store.keys, wall_clock=utc_now)
    team_access = TeamAccess(teams=store.teams)
    history = MetricsHistory(sample=metrics.totals, clock=clock)
    # A standby shows the nodes as the leader wrote them to the store.
    fleet_view = FleetView(
        store=store.leadership,
        leading=leadership.is_leader,
        leader=lambda: leadership.info().leader,
        wall_clock=utc_now,
    )
    admin_app = create_admin_app(
        pool=pool,
        registry=registry,
        clock=clock,
        on_demand=lambda: [m.name for m in catalog.models() if m.activation],
        queue=request_queue.snapshot,
        extra_routes=[
            *key_routes(
                service=key_service,
                usage=store.usage,
                wall_clock=utc_now,
                teams=store.teams,
                base_of=lambda name: _base_of(catalog, name),
            ),
            *team_routes(
                teams=store.teams,
                access=team_access,
                keys=key_service,
                usage=store.usage,
                wall_clock=utc_now,
            ),
            *node_routes(
                inventory=inventory,
                fleet=fleet_view,
                remove_weights=agents.remove_weights,
                remove_node=NodeRemoval(
                    identities=store.nodeids,
                    inventory=inventory,
                    streams=agents,
                    wall_clock=utc_now,
                    record_event=lambda node_id, message: controller.note("node", node_id, message),
                ).remove,
            ),
            *model_routes(catalog=catalog, control=model_control, pulls=puller),
            *config_routes(reloader=reloader),
            *join_token_routes(
                issuer=pki,
                unavailable=tokens_unavailable(security),
                wall_clock=utc_now,
                agent_address=_agent_address(cfg),
            ),
            *event_routes(source=model_control),
            # The profiler times itself with time.monotonic on its own thread.
            *debug_routes(profiler=Profiler(), tracer=AllocationTracer(wall_clock=utc_now)),
            *leader_routes(
                leadership=leadership,
                servers=store.leadership,
                wall_clock=utc_now,
                ttl=cfg.control.lease_ttl,
            ),
            *create_dashboard_routes(
                sources=dashboard_sources(
                    inventory=inventory,
                    catalog=catalog,
                    model_control=model_control,
                    keys=key_service,
                    usage=store.usage,
                    leadership=leadership,
                    servers=directory.latest,
                    lease_ttl=cfg.control.lease_ttl,
                    history=history,
                    wall_clock=utc_now,
                    agent_listener=agent_listener_view(security),
                    fleet=fleet_view,
                    queue=request_queue.model_state,
                    teams=store.teams,
                    team_pages=TeamPageSources(
                        access=team_access, teams=store.teams, keys=key_service, usage=store.usage
                    ),
                    pulls=puller.view,
                )
            ),
        ],
    )
    admin_portal = create_admin_portal(
        users=store.users,
        sessions=store.sessions,
        # Unguarded: the portal itself has checked the caller's session.
        admin_app=admin_app,
        session_ttl=cfg.auth.session_ttl,
        slowdown_after=cfg.auth.login_slowdown_after,
        slowdown_max=cfg.auth.login_slowdown_max,
        clock=clock,
        wall_clock=utc_now,
        # Over plain HTTP a Secure cookie would never come back.
        secure_cookies=cfg.api_tls is not None,
        passwords=Passwords(executor=login_pool, max_waiting=LOGIN_HASH_WAITING),
        teams=team_access,
        sso=(
            build_sso(cfg, client=sso_client, store=store, clock=clock, wall_clock=utc_now)
            if sso_client is not None
            else None
        ),
        local_login=cfg.auth.local_login,
    )
    apps: dict[str, Any] = {
        "API": RouterApp(
            proxy=proxy,
            pool=pool,
            metrics=metrics,
            authenticator=authenticator,
            limiter=limiter,
            usage=usage,
            max_body_bytes=cfg.router.max_body_bytes,
            clock=clock,
            wall_clock=utc_now,
            started_at=int(time.time()),
            admin_portal=browser_guard(
                admin_portal,
                surface="/admin on the API port",
                allowed_hosts=_own_names(cfg.listen, cfg.admin.allowed_hosts),
                form_paths=FORM_PATHS,
                secret_reads=SECRET_READS | debug_paths(),
            ),
            model_names=lambda name: _model_names(catalog, name),
            queue_wait=cfg.router.queue.max_wait,
            token_counter=TokenCounter(pool=pool, upstream=upstream, clock=clock),
            tracer=router_tracer,
            access_log=(
                AccessLog(sample=cfg.telemetry.access_log_sample, rng=random.random)
                if cfg.telemetry.access_log
                else None
            ),
        ),
        "admin": browser_guard(
            admin_guard(admin_app, authenticator=authenticator),
            surface="the admin listener",
            allowed_hosts=_own_names(cfg.admin_listen, cfg.admin.allowed_hosts),
            # A liveness probe learns nothing but "up".
            host_exempt=("/healthz",),
            secret_reads=debug_paths(),
        ),
        "metrics": create_metrics_app(registry=registry),
    }
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    hangup = asyncio.Event()
    loop.add_signal_handler(signal.SIGHUP, hangup.set)
    hosts = {"API": cfg.listen.host, "admin": cfg.admin_listen.host}
    if cfg.metrics_listen is not None:
        hosts["metrics"] = cfg.metrics_listen.host
    await limiter.start()
    agent_listener: AgentListener | None = None
    try:
        if cfg.agent_listen is not None:
            try:
                if pki is not None:
                    agent_listener = await serve_cluster_agents(
                        servicer=agents,
                        pki=pki,
                        host=cfg.agent_listen.host,
                        port=cfg.agent_listen.port,
                        ping_interval=cfg.control.agent_ping_interval,
                    )
                else:
                    agent_listener = await serve_agents(
                        servicer=agents,
                        host=cfg.agent_listen.host,
                        port=cfg.agent_listen.port,
                        tls=cfg.agent_tls,
                        ping_interval=cfg.control.agent_ping_interval,
                    )
            except AgentListenerError as exc:
                raise StartupError(str(exc)) from exc
            if security == "insecure":
                log.warning(
                    "INSECURE AGENTS (--insecure-agents): the agent listener on %s:%d takes "
                    "plaintext agents without certificates; any host that reaches it can "
                    "register as any node and receive users' prompts. Restart without "
                    "--insecure-agents to have nodes join with a token over mTLS",
                    cfg.agent_listen.host,
                    agent_listener.port,
                )
            log.info("agent listener on %s:%d", cfg.agent_listen.host, agent_listener.port)
        async with asyncio.TaskGroup() as group:
            background = [
                group.create_task(guard("health prober", prober.run())),
                group.create_task(guard("engine load reader", engine_loads.run())),
                *(
                    [
                        group.create_task(
                            guard("prefix index sharing", prefix_share.run(balancer.learn))
                        )
                    ]
                    if prefix_share is not None
                    else []
                ),
                *([group.create_task(guard("cluster PKI", pki.run()))] if pki is not None else []),
                group.create_task(guard("reachability checker", gate.run())),
                group.create_task(guard("usage pruner", pruner.run())),
                group.create_task(
                    guard(
                        "leadership",
                        leadership.run(
                            lead=lambda epoch: _lead(
                                epoch,
                                controller,
                                store_publisher,
                                store,
                                agents,
                                placements,
                                fleet=lambda epoch: publish_fleet(
                                    store=store.leadership,
                                    views=lambda: {
                                        n.id: node_view(n, inventory.heartbeat_age(n))
                                        for n in inventory.nodes()
                                    },
                                    lease_name=LEASE_NAME,
                                    epoch=epoch,
                                    on_fenced=leadership.lost,
                                    interval=FLEET_INTERVAL,
                                ),
                                puller=puller,
                            ),
                            follow=lambda: _follow(
                                follow_endpoints(
                                    store=store.leadership,
                                    apply=controller.apply_followed,
                                    interval=FOLLOW_INTERVAL,
                                ),
                                fleet_view.follow(interval=FOLLOW_INTERVAL),
                            ),
                        ),
                    )
                ),
                group.create_task(
                    guard(
                        "demand sync",
                        sync_demand(
                            store=store.leadership,
                            demand=controller.demand,
                            server_id=server_id,
                            leading=leadership.is_leader,
                            on_remote=controller.wake,
                            on_load=controller.check_load,
                            interval=DEMAND_INTERVAL,
                            wall_clock=utc_now,
                            ttl=cfg.control.lease_ttl,
                        ),
                    )
                ),
                group.create_task(
                    guard(
                        "server announcer",
                        directory.run(),
                    )
                ),
                group.create_task(guard("catalog poller", _poll_catalog(catalog))),
                group.create_task(guard("config reloader", _reload_on_hangup(reloader, hangup))),
                group.create_task(guard("metrics history", history.run())),
                group.create_task(
                    guard(
                        "node sweeper",
                        run_sweeper(
                            inventory=inventory, interval=SWEEP_INTERVAL, sleep=asyncio.sleep
                        ),
                    )
                ),
            ]
            if key_authenticator is not None:
                background.append(
                    group.create_task(guard("key cache refresher", key_authenticator.run()))
                )
            if ledger is not None:
                background.append(group.create_task(guard("fair-share sync", ledger.run())))
            if flow_share is not None:
                background.append(group.create_task(guard("reserve counts sync", flow_share.run())))
            usage_task = group.create_task(guard("usage writer", usage.run()))
            servers: list[QuietServer] = []
            server_tasks = []
            for listener in listeners:
                connections = ConnectionGate(
                    name=listener.name, limits=cfg.server, metrics=listener_metrics, clock=clock
                )
                server = make_server(
                    apps[listener.name],
                    graceful_seconds=GRACE_SECONDS,
                    gate=connections,
                    tls=listener.tls,
                )
                servers.append(server)
                server_tasks.append(
                    group.create_task(
                        guard(f"{listener.name} listener", server.serve([listener.sock]))
                    )
                )
                log.info("%s listener on %s", listener.name, listener.url(hosts[listener.name]))
            if catalog.models():
                log.info(
                    "control plane: %d models in the catalog (%s), %d static endpoints; store %s",
                    len(catalog.models()),
                    ", ".join(m.name for m in catalog.models()),
                    len(cfg.endpoints),
                    store.url,
                )
            else:
                log.info(
                    "router-only mode: %d endpoints serving %s; store %s",
                    len(cfg.endpoints),
                    ", ".join(pool.models()),
                    store.url,
                )
            log.debug("%d start-up objects frozen", tune_garbage_collector())
            if pki is not None and agent_listener is not None and cfg.agent_listen is not None:
                await announce_join(
                    pki,
                    cfg.control.advertise_agent_address
                    or dialable(cfg.agent_listen.host, agent_listener.port),
                )
            await stop.wait()
            log.info("shutting down: no new connections, finishing in-flight requests")
            for server in servers:
                server.should_exit = True
            # uvicorn's serve() returns once its connections are drained or the grace ends.
            await asyncio.gather(*server_tasks)
            # Every answered request is queued by now: write them all before leaving.
            await usage.close()
            await usage_task
            for task in background:
                task.cancel()
    finally:
        # After the HTTP listeners drained: end the agent streams (agents reconnect
        # by themselves, their engines keep running), then close the clients.
        if agent_listener is not None:
            await agent_listener.stop(AGENT_STOP_GRACE)
        await limiter.close()
        if ledger is not None:
            await ledger.close()
        if flow_share is not None:
            await flow_share.close()
        await upstream.close()
    log.info("stopped")


def _routed(gate: ReachabilityGate, replica_id: str) -> bool:
    """Whether this server's router routes to the replica: its reach check passed."""
    reach = gate.reach(replica_id)
    return reach is not None and reach.state == "reachable"
