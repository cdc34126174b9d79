"""Settings of `llmgw server`, grouped by concern.

Each default says why it is what it is. These models only validate shape and
ranges; they do not check that an endpoint is reachable.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from llmgw.config.continuation import ContinuationConfig
from llmgw.config.models import ModelConfig
from llmgw.config.oidc import OidcConfig
from llmgw.config.queue import QueueConfig
from llmgw.config.routing import RoutingConfig
from llmgw.config.telemetry import TelemetryConfig

EngineName = Literal["vllm", "sglang", "llamacpp", "sim"]
"""The engines llmgw knows (`llmgw.engines.KNOWN_ENGINES`; a unit test keeps them equal)."""

EndpointRoute = Literal[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/rerank",
    "/v1/score",
    "/tokenize",
    "/detokenize",
    "/v1/audio/transcriptions",
    "/v1/audio/translations",
]
"""The client routes an endpoint may serve (`llmgw.engines.routes.ALL_ROUTES`)."""

_ENDPOINT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$")
# The longest model name a request may send (`llmgw.store.MAX_MODEL_CHARS`; the config
# layer sits below the store and keeps its own copy).
_MAX_MODEL_CHARS = 256


def split_host_port(text: str) -> dict[str, object]:
    """'host:port' or '[v6]:port' as fields; raises ValueError saying the expected form."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{text!r} is not HOST:PORT (for example 127.0.0.1:8080)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return {"host": host, "port": int(port)}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ListenAddress(_Strict):
    """A host and port to listen on."""

    host: str
    port: Annotated[int, Field(ge=0, le=65535)]

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: object) -> object:
        if isinstance(value, str):
            return split_host_port(value)
        return value

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


class ApisConfig(_Strict):
    """How the router serves each client API besides OpenAI's on one endpoint:
    `native` sends the client's request as is to the engine's own path for it
    (vLLM serves both; SGLang serves Responses), `translate` turns it into a
    chat completion and the answer back."""

    messages: Literal["native", "translate"] = Field(
        default="translate",
        description="Anthropic Messages (/v1/messages). Translation by default: every "
        "OpenAI-compatible engine serves chat completions, not every one serves Messages.",
    )
    responses: Literal["native", "translate"] = Field(
        default="translate",
        description="OpenAI Responses (/v1/responses). Translation by default, for the same "
        "reason; `native` also carries what a translation cannot (stored responses, "
        "previous_response_id) when the engine keeps them.",
    )

    def native(self) -> frozenset[str]:
        """The APIs served natively, by name ("messages", "responses")."""
        return frozenset(
            name
            for name, mode in (("messages", self.messages), ("responses", self.responses))
            if mode == "native"
        )


class EndpointConfig(_Strict):
    """One OpenAI-compatible engine the router may send requests to."""

    id: str = Field(description="Stable name of the endpoint, shown in metrics and headers.")
    url: str = Field(description="Base URL of the engine, e.g. http://10.0.0.5:8000.")
    models: list[str] = Field(min_length=1, description="Model names this endpoint serves.")
    health_path: str = Field(
        default="/v1/models",
        description=(
            "Path probed for health. /v1/models is answered by every OpenAI-compatible "
            "engine (llama.cpp's server has no /health), so it is the safe default."
        ),
    )
    max_in_flight: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Requests in flight on this engine before it counts as saturated (requests "
            "then wait in the router). Unset by default: router.max_in_flight applies."
        ),
    )
    engine: EngineName | None = Field(
        default=None,
        description=(
            "The kind of engine behind the URL: vllm, sglang, llamacpp or sim. It decides "
            "which routes the endpoint serves and under which paths (llama.cpp tokenizes "
            "at /extras/tokenize). Unset by default: llmgw does not guess, and passes "
            "every route on as it comes, leaving the engine to answer for itself."
        ),
    )
    routes: list[EndpointRoute] | None = Field(
        default=None,
        description=(
            "The client routes this endpoint serves, when fewer than its engine's: "
            "requests for other routes never reach it, and a model none of whose "
            "endpoints serves a route answers 404 naming it. Unset by default: the "
            "engine's routes (every route when `engine` is unset)."
        ),
    )
    apis: ApisConfig = Field(
        default_factory=ApisConfig,
        description="Per client API (messages, responses): native or translate. Both "
        "translate by default, since every OpenAI-compatible engine serves chat completions.",
    )
    reasoning_parser: str | None = Field(
        default=None,
        description=(
            "The reasoning parser the engine was started with (vLLM's --reasoning-parser, "
            "e.g. deepseek_r1, qwen3; SGLang's deepseek-r1, qwen3). A stream broken "
            "mid-thought is continued only on replicas whose parser reads a thought back "
            "from `<think>...</think>`. Unset by default: llmgw does not guess, and such "
            "streams are not continued. Needs `engine`."
        ),
    )
    tool_call_parser: str | None = Field(
        default=None,
        description=(
            "The tool parser the engine was started with (vLLM's --tool-call-parser, e.g. "
            "hermes; SGLang's qwen25). A stream broken mid tool call is continued only on "
            "replicas whose parser reads calls back from hermes' `<tool_call>` markup. "
            "Unset by default: llmgw does not guess, and such streams are not continued. "
            "Needs `engine`."
        ),
    )

    @field_validator("reasoning_parser", "tool_call_parser")
    @classmethod
    def _check_parser(cls, value: str | None) -> str | None:
        if value is not None and (not value or value != value.strip() or " " in value):
            raise ValueError(f"{value!r} is not a parser name (e.g. hermes, deepseek_r1)")
        return value

    @model_validator(mode="after")
    def _parsers_need_engine(self) -> EndpointConfig:
        named = [f for f in ("reasoning_parser", "tool_call_parser") if getattr(self, f)]
        if named and self.engine is None:
            raise ValueError(
                f"{named[0]} is set but engine is not: a parser's markup is known only for "
                "a declared engine; set engine (vllm, sglang, llamacpp or sim)"
            )
        return self

    def parser_args(self) -> list[str]:
        """The parsers as the engine's own flags, for `llmgw.engines.continues_thoughts`
        and `continues_tool_calls`."""
        args: list[str] = []
        if self.reasoning_parser:
            args += ["--reasoning-parser", self.reasoning_parser]
        if self.tool_call_parser:
            args += ["--tool-call-parser", self.tool_call_parser]
        return args

    @field_validator("id")
    @classmethod
    def _check_id(cls, value: str) -> str:
        if not _ENDPOINT_ID.match(value):
            raise ValueError(
                "must be 1-63 letters, digits, '_', '.', ':' or '-', "
                "starting with a letter or digit"
            )
        return value

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} is not an http:// or https:// URL")
        rest = value.split("://", 1)[1]
        if not rest or rest.startswith("/"):
            raise ValueError(f"{value!r} has no host")
        return value.rstrip("/")

    @field_validator("models")
    @classmethod
    def _check_models(cls, value: list[str]) -> list[str]:
        for name in value:
            if not name or name != name.strip():
                raise ValueError(f"model name {name!r} is empty or has surrounding spaces")
            # What the router accepts in a request's `model` (and the usage store holds).
            if len(name) > _MAX_MODEL_CHARS or not name.isprintable():
                shown = repr(name) if len(name) <= 40 else repr(name[:40]) + "..."
                raise ValueError(
                    f"model name {shown} is not 1 to {_MAX_MODEL_CHARS} printable characters; "
                    "no request could name it"
                )
        return value

    @field_validator("routes")
    @classmethod
    def _check_routes(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value:
            raise ValueError("must name at least one route; leave it unset for the engine's own")
        return value

    @field_validator("health_path")
    @classmethod
    def _check_health_path(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        return value


class TimeoutsConfig(_Strict):
    """Per-phase deadlines of one upstream attempt, in seconds."""

    connect: float = Field(
        default=5.0, gt=0, description="TCP connect; an engine on the LAN answers in ms."
    )
    first_byte: float = Field(
        default=300.0,
        gt=0,
        description=(
            "From sending the request to the first byte of the answer: engine queue plus "
            "prefill, which for a long prompt on a busy engine takes minutes."
        ),
    )
    idle: float = Field(
        default=60.0, gt=0, description="Longest silence between two chunks of a stream."
    )
    total: float = Field(
        default=1800.0, gt=0, description="Whole request; long generations take many minutes."
    )


class HealthConfig(_Strict):
    """Active probes and passive ejection of endpoints."""

    interval: float = Field(default=5.0, gt=0, description="Seconds between active probes.")
    timeout: float = Field(default=2.0, gt=0, description="Deadline of one probe.")
    failure_threshold: int = Field(
        default=3,
        ge=1,
        description="Consecutive request failures that eject an endpoint (one is noise).",
    )
    ejection_base: float = Field(
        default=1.0, gt=0, description="First ejection, doubled after each further ejection."
    )
    ejection_max: float = Field(default=60.0, gt=0, description="Cap on the ejection time.")


class RouterConfig(_Strict):
    """The data plane's behaviour."""

    max_body_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        description="Largest request body accepted; long-context prompts reach several MB.",
    )
    attempts: int = Field(
        default=3,
        ge=1,
        le=10,
        description="Tries per request over different endpoints, before the first byte only.",
    )
    retry_after: int = Field(
        default=5, ge=1, description="Retry-After seconds sent with 503 no healthy replica."
    )
    timeouts: TimeoutsConfig = TimeoutsConfig()
    health: HealthConfig = HealthConfig()
    max_in_flight: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Requests in flight per replica before it counts as saturated and requests "
            "wait in the router's queue; a static endpoint's or catalog model's own "
            "max_in_flight wins. Unset by default: nothing is held back (fail open)."
        ),
    )
    queue: QueueConfig = QueueConfig()
    continuation: ContinuationConfig = ContinuationConfig()
    routing: RoutingConfig = Field(
        default_factory=RoutingConfig,
        description="Cache-, session- and load-aware choice of replica; on by default.",
    )


class HttpServerConfig(_Strict):
    """How every HTTP listener (API, admin, metrics) treats slow and numerous clients."""

    header_timeout: float = Field(
        default=10.0,
        gt=0,
        description=(
            "Seconds a client has to send a request's line and headers, counted from "
            "the connection's start (or a kept-alive request's first byte); then the "
            "connection is closed. Any client sends its headers in milliseconds; 10 s "
            "covers a slow link and still frees what a stalled client (slowloris) holds."
        ),
    )
    body_timeout: float = Field(
        default=30.0,
        gt=0,
        description=(
            "Seconds a request body may go without a byte arriving; then the client gets "
            "408 and the connection is closed. Time this server is not reading (the "
            "request waits in the router) does not count. Long enough for a congested "
            "uplink sending a multi-MB prompt, short enough that a stopped body frees "
            "its connection and task."
        ),
    )
    max_connections: int = Field(
        default=2048,
        ge=1,
        description=(
            "Connections each listener keeps open at most; a client beyond that gets 503 "
            "(with Retry-After) once its headers are in, and is closed. Each connection "
            "costs a file descriptor and some memory; 2048 is far above what one router "
            "process serves well, so it only stops a flood."
        ),
    )


class AuthConfig(_Strict):
    """Who may call the API."""

    mode: Literal["required", "open"] = Field(
        default="required",
        description=(
            "required: every /v1 request needs an API key (`llmgw keys create`). "
            "open: no keys at all, for a trusted network only; the start-up log says so."
        ),
    )
    refresh_interval: float = Field(
        default=2.0,
        gt=0,
        description=(
            "Seconds between polls for keys created, revoked or rotated by another "
            "process; a revoked key stops working within about this long everywhere."
        ),
    )
    session_ttl: float = Field(
        default=28800.0,
        gt=0,
        description=(
            "Seconds an admin login on the API port lasts (8 h: one working day); "
            "after that the browser must log in again."
        ),
    )
    login_slowdown_after: int = Field(
        default=3,
        ge=1,
        description=(
            "Failed logins from one address (or for one user) before answers slow down; "
            "a person mistyping twice is not slowed, a password-guessing script is."
        ),
    )
    login_slowdown_max: float = Field(
        default=10.0,
        gt=0,
        description=(
            "Longest delay, in seconds, before answering a login after repeated failures "
            "(doubling from 0.5 s); long enough to make guessing slow, short enough not to "
            "lock out the real user."
        ),
    )
    local_login: bool = Field(
        default=True,
        description=(
            "Whether users created with `llmgw users create` may log in with a password "
            "on /admin. Turn it off once everyone signs in through `oidc`, so that a "
            "leaked local password opens nothing."
        ),
    )
    oidc: OidcConfig | None = Field(
        default=None,
        description=(
            "Single sign-on for the dashboard through an OpenID Connect provider. "
            "Unset: local users and passwords only."
        ),
    )

    @model_validator(mode="after")
    def _some_login(self) -> AuthConfig:
        if not self.local_login and self.oidc is None:
            raise ValueError(
                "local_login is false and oidc is not set, so nobody could log in to the "
                "dashboard: configure oidc, or leave local_login on"
            )
        return self


class LimitsConfig(_Strict):
    """Where rate-limit counters live."""

    redis_url: str | None = Field(
        default=None,
        description=(
            "redis://HOST:PORT/DB shared by several router processes. Unset: exact "
            "counters in this process only, right for a single router."
        ),
    )

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"{value!r} is not a redis://, rediss:// or unix:// URL")
        return value


class UsageConfig(_Strict):
    """Per-request usage records."""

    retention_days: float = Field(
        default=30.0,
        gt=0,
        description=(
            "Raw rows older than this are pruned; the hourly roll-ups that usage "
            "queries read are kept, so tables stay small without losing totals."
        ),
    )
    queue_size: int = Field(
        default=10000,
        ge=1,
        description="Records waiting to be written; when full, new ones are counted and dropped.",
    )
    batch_size: int = Field(
        default=500, ge=1, description="Records per write: one round trip for many requests."
    )
    flush_interval: float = Field(
        default=0.5, gt=0, description="Longest a record waits before being written."
    )


class ControlConfig(_Strict):
    """The control plane's view of nodes."""

    heartbeat_interval: float = Field(
        default=5.0,
        gt=0,
        description=(
            "Seconds between agent heartbeats; sent to every agent when it registers. "
            "Above `heartbeat_scale_above` connected nodes the server hands out a "
            "multiple of it (see there)."
        ),
    )
    heartbeat_scale_above: int = Field(
        default=5000,
        ge=1,
        description=(
            "Connected nodes up to which agents heartbeat every `heartbeat_interval`. With "
            "more, the interval is `heartbeat_interval` times ceil(nodes / this), so the "
            "server handles at most about this many heartbeats per interval; agents are "
            "told the new interval, and `unreachable_after` / `lost_after` grow for each "
            "node by the same factor as the interval it was told."
        ),
    )
    agent_ping_interval: float | None = Field(
        default=10.0,
        gt=0,
        description=(
            "Seconds an agent connection may send the server nothing before the server "
            "pings it (HTTP/2 keepalive); a ping unanswered for 10 s ends the connection, "
            "so that of a host that vanished without closing TCP ends (and its node shows "
            "disconnected) instead of staying open. Heartbeats count as something, so "
            "while agents heartbeat more often than this the server sends no pings. null "
            "turns the server's pings off."
        ),
    )
    registrations_per_second: float = Field(
        default=300.0,
        gt=0,
        description=(
            "Agent registrations taken per second; in a storm (every node reconnecting at "
            "once) the others are told to come back after a jittered delay instead of "
            "queueing. 300 a second re-registers 10,000 nodes in about 35 s and leaves "
            "the event loop time for the API on a 2-core server. Fewer are taken while "
            "registrations are answered slower than 2 s (the server short of CPU), so "
            "every one taken is answered before its agent's connect timeout."
        ),
    )
    registration_burst: int = Field(
        default=100,
        ge=1,
        description=(
            "Registrations taken at once before the pace applies: a restart of a small "
            "fleet is never deferred."
        ),
    )
    unreachable_after: float = Field(
        default=15.0,
        gt=0,
        description=(
            "A node with no heartbeat for this long is unreachable (three missed beats); "
            "for a node told a longer interval (`heartbeat_scale_above`), as many times "
            "longer as its interval is."
        ),
    )
    lost_after: float = Field(
        default=60.0,
        gt=0,
        description=(
            "A node with no heartbeat for this long is lost and its replicas belong "
            "elsewhere; long enough to ride out a control-plane restart. Scaled per node "
            "as `unreachable_after` is."
        ),
    )

    reconcile_interval: float = Field(
        default=5.0,
        gt=0,
        description=(
            "Seconds between full reconciles. Every relevant event (a node registers, a "
            "shard changes state, the catalog changes, a request activates a model) "
            "reconciles at once; the interval only catches what no event announced."
        ),
    )
    placement: Literal["pack", "spread"] = Field(
        default="pack",
        description=(
            "pack fills nodes up (keeps whole nodes free for large models); spread "
            "puts replicas on the emptiest nodes (fewer replicas lost with one node)."
        ),
    )
    mgmt_interface: str = Field(
        default="",
        description=(
            "The network the ranks of a multi-node replica talk over: an interface name "
            "('eth1', 'ib0') or a CIDR ('10.77.1.0/24') matched against the addresses "
            "each agent reports. A node label llmgw.mgmt-interface overrides it per node. "
            "Empty by default: the interface holding the address the node advertises, "
            "which is right when one network carries everything."
        ),
    )
    retry_base: float = Field(
        default=5.0,
        gt=0,
        description=(
            "Seconds to wait before retrying a model whose replica failed; doubled after "
            "each further failure. Short enough for a flaky start, long enough not to "
            "hammer a node with an engine that crashes on load."
        ),
    )
    retry_max: float = Field(
        default=300.0,
        gt=0,
        description="Cap on the retry wait: a broken model is still retried every 5 minutes.",
    )
    activation_timeout: float = Field(
        default=600.0,
        gt=0,
        description=(
            "How long a request for a model with no ready replica waits for one to "
            "start. vLLM loading a 70B model from local disk takes minutes."
        ),
    )
    activation_keepalive: float = Field(
        default=5.0,
        gt=0,
        description=(
            "Seconds between SSE comments sent to a streaming client while its model "
            "starts, so proxies with idle timeouts (often 30-60 s) keep the connection."
        ),
    )
    lease_ttl: float = Field(
        default=15.0,
        gt=0,
        description=(
            "Seconds the leader's lease lasts; renewed every third of it. A standby takes "
            "over within about this long after the leader dies; shorter means faster "
            "failover and more store writes."
        ),
    )
    advertise_agent_address: str | None = Field(
        default=None,
        description=(
            "HOST:PORT agents use to reach this server's agent listener; a standby names "
            "the leader's in its refusal. Unset: the agent listener's address, with this "
            "host's name in place of 0.0.0.0."
        ),
    )
    stop_grace: float = Field(
        default=30.0,
        gt=0,
        description=(
            "Seconds a stopping replica gets to finish in-flight requests before its "
            "engine is killed; matches the server's own shutdown grace."
        ),
    )
    cluster_key_file: str | None = Field(
        default=None,
        description=(
            "File of the cluster key that seals the cluster CA's private key in the store "
            "(32 random bytes, hex, mode 0600); every server of a shared store needs the "
            "same file. Unset: <data-dir>/cluster.key, created by the first server."
        ),
    )
    agent_server_names: list[str] = Field(
        default_factory=list,
        description=(
            "More DNS names or IP addresses agents dial this server by (a load balancer's "
            "name, a NAT address), added to its certificate; its listen address, host "
            "name, interface addresses and loopback are always in it."
        ),
    )
    ca_lifetime: float = Field(
        default=10 * 365 * 86400.0,
        gt=0,
        description=(
            "Seconds the cluster CA created by the first server is valid: 10 years, since "
            "replacing it means every node joins again."
        ),
    )
    server_cert_lifetime: float = Field(
        default=90 * 86400.0,
        gt=0,
        description=(
            "Seconds a server's certificate for agents is valid (90 days); it is renewed "
            "automatically after two thirds of that."
        ),
    )
    node_cert_lifetime: float = Field(
        default=30 * 86400.0,
        gt=0,
        description=(
            "Seconds a node certificate is valid (30 days): short, so a stolen one is not "
            "useful for long; agents renew after two thirds of it."
        ),
    )

    @model_validator(mode="after")
    def _ordered(self) -> ControlConfig:
        if not self.heartbeat_interval < self.unreachable_after < self.lost_after:
            raise ValueError(
                "needs heartbeat_interval < unreachable_after < lost_after, got "
                f"{self.heartbeat_interval:g} / {self.unreachable_after:g} / {self.lost_after:g}"
            )
        if self.retry_max < self.retry_base:
            raise ValueError(
                f"retry_max ({self.retry_max:g}) is below retry_base ({self.retry_base:g})"
            )
        return self


class AgentTLSConfig(_Strict):
    """TLS with client certificates on the agent listener (files from `llmgw certs`)."""

    cert: str = Field(description="PEM certificate this server presents to agents.")
    key: str = Field(description="PEM private key of that certificate.")
    ca: str = Field(
        description=(
            "PEM certificate of the CA that issued the agents' certificates; an agent "
            "without one of its certificates is refused, and a node's id is its "
            "certificate's name."
        )
    )


class ApiTLSConfig(_Strict):
    """TLS on the API listener: the OpenAI endpoint and the dashboard's login."""

    cert: str = Field(description="PEM certificate (chain) the API listener presents to clients.")
    key: str = Field(description="PEM private key of that certificate.")


_HOST_NAME = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*$")


class AdminConfig(_Strict):
    """Who may reach the admin listener and the API port's `/admin` through a browser."""

    allowed_hosts: list[str] = Field(
        default_factory=list,
        description=(
            "Host names (or addresses) browsers and tools may use to reach the admin "
            "listener and /admin on the API port, besides IP addresses, localhost and the "
            "listeners' own names, e.g. gw.example.com when the dashboard is "
            "opened at https://gw.example.com/admin. Empty by default: any other Host "
            "header is refused, so that a web page cannot reach these listeners through "
            "a name of its own that resolves to this machine (DNS rebinding). Names only, "
            "without scheme or port."
        ),
    )

    @field_validator("allowed_hosts")
    @classmethod
    def _check_hosts(cls, value: list[str]) -> list[str]:
        return [normalize_allowed_host(entry) for entry in value]


def normalize_allowed_host(entry: str) -> str:
    """`entry` as the admin guard compares it (lower case, no brackets, no trailing
    dot); ValueError naming what is wrong with it."""
    name = entry.strip().lower()
    if "://" in name or "/" in name:
        raise ValueError(f"{entry!r}: give a host name only, without scheme or path")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    name = name.rstrip(".")
    if ":" in name and name.count(":") == 1:
        raise ValueError(f"{entry!r}: leave the port out; any port of an allowed name is accepted")
    if ":" in name:
        try:
            ipaddress.IPv6Address(name)
        except ValueError as exc:
            raise ValueError(f"{entry!r} is not a host name or IP address") from exc
        return name
    if not _HOST_NAME.match(name):
        raise ValueError(f"{entry!r} is not a host name or IP address")
    return name


class ServerConfig(_Strict):
    """Everything `llmgw server` needs; flags override the file."""

    listen: ListenAddress = ListenAddress(host="0.0.0.0", port=8080)
    admin_listen: ListenAddress = ListenAddress(host="127.0.0.1", port=9090)
    metrics_listen: ListenAddress | None = None
    agent_listen: ListenAddress | None = Field(
        default=ListenAddress(host="0.0.0.0", port=9443),
        description="gRPC listener the node agents dial; null turns it off.",
    )
    agent_tls: AgentTLSConfig | None = Field(
        default=None,
        description=(
            "mTLS for the agent listener with certificates of your own (`llmgw certs`); "
            "unset: the cluster CA in the store, and nodes join with a token."
        ),
    )
    insecure_agents: bool = Field(
        default=False,
        description=(
            "Serve the agent listener in plaintext, without certificates: any host that "
            "reaches it can register as a node. Off: TLS with the cluster CA, and nodes join "
            "with a token (or agent_tls, with certificates of your own)."
        ),
    )
    api_tls: ApiTLSConfig | None = Field(
        default=None,
        description=(
            "HTTPS on the API listener (--listen); dashboard login cookies are then "
            "Secure. Unset: plain HTTP, for a trusted network or behind a proxy that "
            "terminates TLS."
        ),
    )
    data_dir: str | None = Field(
        default=None,
        description="Where the SQLite store lives; ~/.local/share/llmgw when unset.",
    )
    store: str | None = Field(
        default=None,
        description="postgresql://USER@HOST/DB to share one store between servers.",
    )
    endpoints: list[EndpointConfig] = Field(default_factory=list)
    server: HttpServerConfig = Field(
        default_factory=HttpServerConfig,
        description="Header and body timeouts and the connection cap of every HTTP listener.",
    )
    router: RouterConfig = RouterConfig()
    auth: AuthConfig = AuthConfig()
    limits: LimitsConfig = LimitsConfig()
    usage: UsageConfig = UsageConfig()
    control: ControlConfig = ControlConfig()
    admin: AdminConfig = AdminConfig()
    telemetry: TelemetryConfig = Field(
        default_factory=TelemetryConfig,
        description="Traces (OpenTelemetry, off by default) and the API access log (off).",
    )
    models: list[ModelConfig] = Field(
        default_factory=list,
        description=(
            "The catalog: models llmgw places on the agents' nodes. Any model here turns "
            "the control plane on; models added through the admin API are kept in the store."
        ),
    )

    @model_validator(mode="after")
    def _one_agent_security(self) -> ServerConfig:
        if self.insecure_agents and self.agent_tls is not None:
            raise ValueError(
                "insecure_agents and agent_tls are both set: drop insecure_agents to use "
                "agent_tls, or drop agent_tls for a plaintext agent listener"
            )
        return self

    @model_validator(mode="after")
    def _unique_endpoint_ids(self) -> ServerConfig:
        seen: set[str] = set()
        for endpoint in self.endpoints:
            if endpoint.id in seen:
                raise ValueError(f"endpoint id {endpoint.id!r} is used twice")
            seen.add(endpoint.id)
        return self
