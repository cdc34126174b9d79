"""The agent's tunables, grouped by the object that uses them.

Defaults are chosen for real GPU nodes; tests shorten them. None of these come
from the control plane except the heartbeat interval, which `Registered` sets.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ConnectionSettings(BaseModel):
    """How the agent dials the control plane and keeps the stream alive."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    connect_timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        description="Time from dialling an address to a connection that has taken the "
        "Register (TCP, TLS and HTTP/2 up) before the next address is tried; long enough "
        "for a loaded server, short enough that a dead or black-holed one does not hold up "
        "the list.",
    )
    register_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        description="Time from a Register taken by a connected server to its Registered "
        "answer. A server working through every node reconnecting at once (a leader "
        "failover) may take seconds to answer one it has taken; dialling again would throw "
        "that work away and join the storm. A server that stopped answering is left sooner "
        "by the keepalive pings; a busy one tells the agent to come back instead.",
    )
    default_heartbeat_seconds: float = Field(
        default=5.0,
        gt=0,
        description="Heartbeat interval when Registered gives none (0); the server normally "
        "sets it.",
    )
    keepalive_time_seconds: float | None = Field(
        default=5.0,
        gt=0,
        description="HTTP/2 keepalive ping interval on an established stream, so that a "
        "server that stopped answering (a frozen process, a host that vanished without "
        "closing TCP) is left within about ten seconds instead of TCP's ~15 minutes, before "
        "a standby's lease takeover (15 s by default) is done. The agent listener accepts "
        "a ping a second; keep this above 1 s. None turns keepalive pings off.",
    )
    keepalive_timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        description="How long a ping may go unanswered before the stream is declared dead "
        "and the agent dials the next server; gRPC answers pings in its core, so a busy "
        "but live server answers in milliseconds.",
    )


class SupervisorSettings(BaseModel):
    """How engine processes are watched and stopped."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    probe_interval_loading_seconds: float = Field(
        default=0.1,
        gt=0,
        description="Readiness probe interval until the engine first answers: small, because "
        "a waiting request is served as soon as the shard is reported ready (this gap was "
        "most of an activation's overhead at 0.25 s; a loopback GET every 0.1 s costs "
        "nothing).",
    )
    probe_interval_ready_seconds: float = Field(
        default=5.0,
        gt=0,
        description="Probe interval once ready; only to notice an engine that stopped "
        "answering (the router has its own health checks).",
    )
    probe_timeout_seconds: float = Field(
        default=2.0,
        gt=0,
        description="One probe's deadline; a busy engine may answer slowly, a hung one never.",
    )
    ready_failures_before_loading: int = Field(
        default=3,
        ge=1,
        description="Consecutive failed probes before a ready shard is reported loading "
        "again; one slow answer under load is not an outage.",
    )
    output_lines: int = Field(
        default=200,
        ge=1,
        description="Engine output lines kept per shard for the failure report.",
    )
    output_poll_seconds: float = Field(
        default=0.5,
        gt=0,
        description="How often an engine's log file is read for new lines; the tail only "
        "matters when the engine fails, so twice a second is plenty.",
    )
    log_max_bytes: int = Field(
        default=64 * 2**20,
        ge=4096,
        description="Size at which an engine's log file is rotated (copied to .1 and cut): "
        "64 MiB keeps a chatty engine's recent history without filling the disk.",
    )
    default_grace_seconds: float = Field(
        default=10.0,
        ge=0,
        description="Process group SIGTERM-to-SIGKILL time when a command gives 0 (proto3's "
        "unset), for an unconfirmed adopted engine, and on agent shutdown with "
        "--stop-engines-on-exit; vLLM and SGLang exit within a few seconds of SIGTERM.",
    )
    identity_refresh_seconds: float = Field(
        default=5.0,
        gt=0,
        description="How often each engine's command line is read again for the state file "
        "(engines such as vLLM rename their process while loading); reading /proc every few "
        "seconds costs nothing, and an agent dying in between is the only gap.",
    )
    adopt_grace_seconds: float = Field(
        default=120.0,
        ge=0,
        description="How long engines adopted from an earlier agent wait for a control plane "
        "to confirm them (a leader answered a Register that listed them) before they are "
        "stopped; two minutes covers a control plane restarting or failing over, and a "
        "retired node leaves nothing running for long.",
    )
