"""`llmgw agent`: the node agent's flags, and its composition root.

Flags are parsed into plain values first (a bad one is one `error:` line and
exit code 2); only then are gRPC, NVML and the engines imported and every
long-lived object built and wired, inside the command. With --tls-ca,
--tls-cert and --tls-key (all three or none) the files are read and checked
at that stage too, so a wrong path is an `error:` naming its flag, and the
node id defaults to the certificate's name (the only one the server accepts).

Engines outlive the agent: on SIGTERM/SIGINT they are left running (unless
--stop-engines-on-exit) and a SIGKILLed agent leaves them too; the next agent
with the same --state-dir and node id adopts them. The state directory is
locked for the agent's life, so a second agent on it is an `error:`.

SIGUSR1 writes every thread's stack (faulthandler, at once) and every asyncio
task's stack (when the loop next runs) to the log on stderr; the agent carries
on.

Not guaranteed: that engines left running are ever adopted (an agent that
never comes back leaves them running; one that comes back stops those no
control plane confirms within --adopt-grace).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from llmgw.agent.errors import FlagError
from llmgw.agent.flags import (
    PortRange,
    WeightsLimit,
    parse_gpus,
    parse_key_values,
    parse_port_range,
    parse_servers,
    parse_size,
    parse_weights_limit,
)
from llmgw.cli.logopts import LogFormat
from llmgw.telemetry.logs import configure_logging
from llmgw.telemetry.logs import log_format as log_format_of

if TYPE_CHECKING:
    from llmgw.agent.enroll import NodeCredentials
    from llmgw.agent.silence import SilentServers
    from llmgw.agent.state import EngineStore
    from llmgw.engines import EngineSettings
    from llmgw.pki import TlsMaterial
    from llmgw.pki.cluster import JoinToken

log = logging.getLogger("llmgw.agent")

DEFAULT_WEIGHTS_DIR = "~/.local/share/llmgw/weights"
DEFAULT_STATE_DIR = "~/.local/share/llmgw/agent"
# Kept equal to ConnectionSettings' connect and register timeouts (a unit test checks).
DEFAULT_DIAL_TIMEOUT = 5.0
DEFAULT_REGISTER_TIMEOUT = 30.0


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def agent(
    server: Annotated[
        str | None,
        typer.Option(
            help="Control-plane agent listener HOST:PORT, tried first.", show_default=False
        ),
    ] = None,
    servers: Annotated[
        str | None,
        typer.Option(
            help="More control-plane servers HOST:PORT,HOST:PORT,..., tried in order after "
            "--server (a standby refuses the stream and the next is tried).",
            show_default=False,
        ),
    ] = None,
    node_id: Annotated[
        str | None,
        typer.Option(
            help="This node's id (default: the name on --tls-cert with TLS, else the hostname).",
            show_default=False,
        ),
    ] = None,
    labels: Annotated[
        str | None,
        typer.Option(help="Node labels k=v,k=v for placement filters.", show_default=False),
    ] = None,
    fabric: Annotated[
        str | None,
        typer.Option(
            help="Fabric labels k=v,... (e.g. ib-domain=pod3): nodes of one multi-node replica "
            "must share them.",
            show_default=False,
        ),
    ] = None,
    weights_dir: Annotated[
        str,
        typer.Option(help="Directory of model weights; created if missing."),
    ] = DEFAULT_WEIGHTS_DIR,
    weights_max_use: Annotated[
        str | None,
        typer.Option(
            help="Evict the least recently used hub snapshots that no engine here runs on "
            "when the weights disk is fuller than this share (85%) or the snapshots take "
            "more than this size (200GB). Unset: nothing is evicted.",
            show_default=False,
        ),
    ] = None,
    sleep_memory_max: Annotated[
        str | None,
        typer.Option(
            help="Host memory that sleeping engines on this node may hold in all (a "
            "sleeping engine keeps its weights in RAM), e.g. 64GiB. The control plane "
            "keeps a replica awake (or stops it later) rather than sleep it past this or "
            "past the memory available. Unset: the memory available is the only limit.",
            show_default=False,
        ),
    ] = None,
    hub_token_file: Annotated[
        str | None,
        typer.Option(
            help="File holding the token for downloading hub weights (a private hub or "
            "mirror). Unset: HF_TOKEN from the environment, if any. The hub itself is "
            "HF_ENDPOINT (default: huggingface.co).",
            show_default=False,
        ),
    ] = None,
    port_range: Annotated[
        str, typer.Option(help="Ports engines on this node may listen on, START-END.")
    ] = "20000-20999",
    gpus: Annotated[
        str | None,
        typer.Option(
            help="GPUs to declare when NVML is not available (tests, demos): COUNTxSIZE such "
            "as 2x24GiB, or a list 1x80GiB,1x40GiB. Ignored when NVML finds GPUs.",
            show_default=False,
        ),
    ] = None,
    advertise_host: Annotated[
        str | None,
        typer.Option(
            help="Host or address the servers' routers use to reach engines on this node "
            "(default: the local address of this agent's connection to the control plane, "
            "learned on each connect). Engines listen on 0.0.0.0 unless it is loopback.",
            show_default=False,
        ),
    ] = None,
    engine_host: Annotated[
        str | None,
        typer.Option(
            help="Address engines listen on, for a node with several networks (default: "
            "0.0.0.0, or 127.0.0.1 when the advertised address is loopback).",
            show_default=False,
        ),
    ] = None,
    engine_python: Annotated[
        str | None,
        typer.Option(
            envvar="LLMGW_ENGINE_PYTHON",
            help="Python interpreter of the environment with llama-cpp-python / SGLang "
            "(default: this interpreter).",
            show_default=False,
        ),
    ] = None,
    engine: Annotated[
        list[str] | None,
        typer.Option(
            help="The executable of one engine kind, KIND=PATH, repeatable: vllm=the vllm "
            "program, sglang= and llamacpp= the Python of an environment that has it, "
            "sim=an llmgw program (default: vllm on PATH, --engine-python for the others, "
            "this llmgw for sim).",
            show_default=False,
        ),
    ] = None,
    state_dir: Annotated[
        str,
        typer.Option(
            envvar="LLMGW_AGENT_STATE_DIR",
            help="Directory of the agent's state (created 0700): the engines it runs and "
            "their logs, so that a restarted agent adopts them.",
        ),
    ] = DEFAULT_STATE_DIR,
    adopt_grace: Annotated[
        float,
        typer.Option(
            min=0,
            help="Seconds engines adopted from an earlier agent wait for a control plane "
            "to confirm them before they are stopped (a retired node leaves nothing "
            "running).",
        ),
    ] = 120.0,
    dial_timeout: Annotated[
        float,
        typer.Option(
            min=0.1,
            help="Seconds a control-plane server gets to answer a dial (join, connect, "
            "renew) before the next is tried; one that let it pass is tried after the "
            "others for a while.",
        ),
    ] = DEFAULT_DIAL_TIMEOUT,
    register_timeout: Annotated[
        float,
        typer.Option(
            min=0.1,
            help="Seconds a connected server gets to answer the Register it has taken "
            "(a server working through a whole fleet reconnecting at once answers late); "
            "one that stopped answering is left sooner, by the keepalive pings.",
        ),
    ] = DEFAULT_REGISTER_TIMEOUT,
    stop_engines_on_exit: Annotated[
        bool,
        typer.Option(
            "--stop-engines-on-exit",
            envvar="LLMGW_AGENT_STOP_ENGINES_ON_EXIT",
            help="On SIGTERM/SIGINT stop every engine (default: leave them running for "
            "the next agent to adopt).",
        ),
    ] = False,
    tls_ca: Annotated[
        str | None,
        typer.Option(
            envvar="LLMGW_AGENT_TLS_CA",
            help="PEM certificate of the CA the server's certificate must come from (mTLS; "
            "with --tls-cert and --tls-key, files from `llmgw certs`).",
            show_default=False,
        ),
    ] = None,
    tls_cert: Annotated[
        str | None,
        typer.Option(
            envvar="LLMGW_AGENT_TLS_CERT",
            help="PEM client certificate of this node (`llmgw certs issue --node NAME`); its "
            "name is the node id the server accepts.",
            show_default=False,
        ),
    ] = None,
    tls_key: Annotated[
        str | None,
        typer.Option(
            envvar="LLMGW_AGENT_TLS_KEY",
            help="PEM private key of --tls-cert (keep it 0600).",
            show_default=False,
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="LLMGW_JOIN_TOKEN",
            help="Join token (`llmgw nodes token create`, or the line `llmgw server` prints): "
            "the agent checks the server against it, joins, and keeps this node's certificate "
            "in --state-dir/tls; later starts reuse it and need no token.",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    log_format: LogFormat = "human",
) -> None:
    """Run the node agent: dial out to the control plane and run engines on command."""
    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise _fail(f"--log-level: {log_level!r} is not one of debug, info, warning, error")
    try:
        chosen_format = log_format_of(log_format, source="--log-format (or LLMGW_LOG_FORMAT)")
    except ValueError as exc:
        raise _fail(str(exc)) from None
    try:
        tls = _tls(ca=tls_ca, cert=tls_cert, key=tls_key)
        join_token = _join_token(token, tls)
        joined = None if tls is not None else _joined(state_dir)
        options = _Options(
            addresses=parse_servers(server, servers),
            node_id=_node_id(node_id, tls, joined),
            tls=tls,
            join_token=join_token,
            cluster=join_token is not None or joined is not None,
            labels=parse_key_values("--labels", labels),
            fabric=parse_key_values("--fabric", fabric),
            port_range=parse_port_range(port_range),
            declared_gpus=parse_gpus(gpus),
            advertise_host=_host("--advertise-host", advertise_host),
            engine_host=_host("--engine-host", engine_host),
            engine_python=_engine_python(engine_python),
            engines=_engines(engine or []),
            adopt_grace=adopt_grace,
            dial_timeout=dial_timeout,
            register_timeout=register_timeout,
            stop_engines_on_exit=stop_engines_on_exit,
            # Last: the only checks with a side effect (they create directories).
            weights_dir=_weights_dir(weights_dir),
            state_dir=_state_dir(state_dir),
            hub_token_file=_hub_token_file(hub_token_file),
            weights_limit=parse_weights_limit(weights_max_use),
            sleep_memory_max=(
                parse_size("--sleep-memory-max", sleep_memory_max)
                if sleep_memory_max is not None
                else 0
            ),
        )
    except FlagError as exc:
        raise _fail(str(exc)) from None
    configure_logging(level, chosen_format)
    import asyncio

    from llmgw.agent.state import EngineStore, StateDirError

    store = EngineStore(options.state_dir, node_id=options.node_id)
    try:
        store.lock()
    except StateDirError as exc:
        raise _fail(f"--state-dir: {exc}") from None
    from llmgw.agent.silence import SilentServers

    # Joining, connecting and renewing share which servers just let a dial time out.
    silent = SilentServers()
    creds = _obtain_certificate(options, silent) if options.cluster else None
    from llmgw.agent.hub import exit_if_downloading

    code = 0
    try:
        asyncio.run(_serve(options, store, creds, silent))
    except Exception as exc:
        # A loop's failure arrives as an ExceptionGroup, already logged by its guard.
        log.critical(
            "the agent stopped after an unexpected error",
            exc_info=not isinstance(exc, BaseExceptionGroup),
        )
        code = 1
    exit_if_downloading(code)
    if code:
        raise typer.Exit(code=code)


@dataclass(frozen=True, slots=True)
class _Options:
    """The parsed flags (plain values only)."""

    addresses: tuple[str, ...]
    node_id: str
    tls: TlsMaterial | None
    join_token: JoinToken | None
    cluster: bool  # the node joins (or joined) the cluster CA
    labels: dict[str, str]
    fabric: dict[str, str]
    weights_dir: Path
    hub_token_file: Path | None
    weights_limit: WeightsLimit | None
    sleep_memory_max: int  # 0: no limit
    port_range: PortRange
    declared_gpus: tuple[int, ...]
    advertise_host: str | None
    engine_host: str | None
    engine_python: str
    engines: dict[str, str]
    adopt_grace: float
    dial_timeout: float
    register_timeout: float
    stop_engines_on_exit: bool
    state_dir: Path


def _tls(*, ca: str | None, cert: str | None, key: str | None) -> TlsMaterial | None:
    """The three TLS files, read and checked now: all three, or none (plaintext)."""
    given = {"--tls-ca": ca, "--tls-cert": cert, "--tls-key": key}
    missing = [flag for flag, value in given.items() if value is None]
    if len(missing) == len(given):
        return None
    if missing:
        raise FlagError(
            missing[0],
            f"TLS needs all of --tls-ca, --tls-cert and --tls-key; {', '.join(missing)} "
            "missing (files from `llmgw certs init` and `llmgw certs issue --node NAME`)",
        )
    # Imported here: cryptography costs every `llmgw` command ~50 ms otherwise.
    from llmgw.pki import PkiFileError, load_tls_material

    paths = {flag: Path(value).expanduser() for flag, value in given.items() if value is not None}
    try:
        return load_tls_material(
            ca=paths["--tls-ca"], cert=paths["--tls-cert"], key=paths["--tls-key"]
        )
    except PkiFileError as exc:
        raise FlagError(f"--tls-{exc.role or 'cert'}", str(exc)) from exc


def _join_token(value: str | None, tls: TlsMaterial | None) -> JoinToken | None:
    if value is None:
        return None
    if tls is not None:
        raise FlagError(
            "--token",
            "give either --token (join the cluster CA) or --tls-ca/--tls-cert/--tls-key "
            "(certificates of your own), not both",
        )
    from llmgw.pki import PkiInputError
    from llmgw.pki.cluster import parse_join_token

    try:
        return parse_join_token(value)
    except PkiInputError as exc:
        raise FlagError("--token", str(exc)) from exc


def _joined(state_dir: str) -> NodeCredentials | None:
    """The certificate this node got when it joined (`<state-dir>/tls`), if it did."""
    from llmgw.cli.agent_join import stored_credentials

    directory = Path(state_dir).expanduser()
    try:
        return stored_credentials(directory)
    except (OSError, ValueError) as exc:
        raise FlagError(
            "--state-dir",
            f"cannot read this node's certificate in {directory / 'tls'}: {exc}; remove that "
            "folder to join again with a new --token",
        ) from exc


def _obtain_certificate(options: _Options, silent: SilentServers) -> NodeCredentials:
    """The node certificate from the store's CA: kept, or joined for now (`error:` if refused)."""
    import asyncio

    from llmgw.agent.enroll import EnrollError
    from llmgw.cli.agent_join import obtain

    try:
        return asyncio.run(
            obtain(
                state_dir=options.state_dir,
                addresses=options.addresses,
                token=options.join_token,
                node_id=options.node_id,
                silent=silent,
                dial_seconds=options.dial_timeout,
            )
        )
    except EnrollError as exc:
        raise _fail(str(exc)) from None


def _token_labels_win(flags: Mapping[str, str], token: Mapping[str, str]) -> dict[str, str]:
    """The labels this node declares: its --labels, with its join token's over them."""
    for key, value in sorted(flags.items()):
        if key in token and token[key] != value:
            log.warning(
                "--labels %s=%s is ignored: this node's join token fixes %s=%s (the server "
                "keeps the token's labels); join with another token to change it",
                key,
                value,
                key,
                token[key],
            )
    return {**flags, **token}


def _node_id(
    value: str | None, tls: TlsMaterial | None, joined: NodeCredentials | None = None
) -> str:
    if value is None and tls is not None and tls.names:
        # With mTLS the server accepts only a name on the certificate: default to it.
        return tls.names[0]
    if joined is not None:
        if value is not None and value.strip() != joined.node_id:
            raise FlagError(
                "--node-id",
                f"this node joined the cluster as {joined.node_id!r} (its certificate is in "
                "--state-dir/tls): drop --node-id, or remove that folder and join again with a "
                "new --token to take another id",
            )
        return joined.node_id
    node_id = socket.gethostname() if value is None else value.strip()
    if not node_id or any(c.isspace() for c in node_id):
        raise FlagError("--node-id", f"{value!r} is not an id: give a non-empty word")
    return node_id


def _hub_token_file(value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.is_file():
        raise FlagError("--hub-token-file", f"{path} is not a readable file; give the token's file")
    return path


def _weights_dir(value: str) -> Path:
    path = Path(value).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FlagError("--weights-dir", f"cannot create {path}: {exc.strerror or exc}") from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise FlagError("--weights-dir", f"{path} is not writable by this user")
    return Path(os.path.realpath(path))


def _host(flag: str, value: str | None) -> str | None:
    if value is None:
        return None
    host = value.strip()
    if not host or "/" in host or any(c.isspace() for c in host):
        raise FlagError(flag, f"{value!r} is not a host name or address (e.g. 10.0.0.7)")
    return host


def _engine_python(value: str | None) -> str:
    if value is None:
        return sys.executable
    if not (os.path.isfile(value) and os.access(value, os.X_OK)):
        raise FlagError(
            "--engine-python", f"{value!r} is not an executable file (LLMGW_ENGINE_PYTHON)"
        )
    return value


def _engines(values: list[str]) -> dict[str, str]:
    """--engine KIND=PATH, each PATH an executable file; a kind given once."""
    from llmgw.engines import KNOWN_ENGINES

    found: dict[str, str] = {}
    for value in values:
        kind, sep, path = value.partition("=")
        kind, path = kind.strip(), path.strip()
        if not sep or not kind or not path:
            raise FlagError(
                "--engine", f"{value!r} is not KIND=PATH (e.g. vllm=/opt/vllm/bin/vllm)"
            )
        if kind not in KNOWN_ENGINES:
            raise FlagError(
                "--engine",
                f"{kind!r} is not an engine kind; give one of {', '.join(KNOWN_ENGINES)}",
            )
        if kind in found:
            raise FlagError("--engine", f"{kind} is given twice")
        resolved = Path(path).expanduser()
        if not (resolved.is_file() and os.access(resolved, os.X_OK)):
            raise FlagError(
                "--engine", f"{kind}={path}: {resolved} is not an executable file on this node"
            )
        found[kind] = str(resolved)
    return found


def _engine_settings(options: _Options) -> EngineSettings:
    from llmgw.engines import EngineSettings

    engines = options.engines
    extra: dict[str, object] = {}
    if "sim" in engines:
        extra["llmgw_command"] = (engines["sim"],)
    return EngineSettings(
        python=options.engine_python,
        vllm_command=engines.get("vllm", "vllm"),
        sglang_python=engines.get("sglang"),
        llamacpp_python=engines.get("llamacpp"),
        weights_dir=str(options.weights_dir),
        **extra,  # type: ignore[arg-type]
    )


def _state_dir(value: str) -> Path:
    from llmgw.agent.state import StateDirError, prepare_state_dir

    try:
        return prepare_state_dir(Path(value))
    except StateDirError as exc:
        raise FlagError("--state-dir", f"{exc} (LLMGW_AGENT_STATE_DIR)") from exc


async def _serve(
    options: _Options,
    store: EngineStore,
    creds: NodeCredentials | None = None,
    silent: SilentServers | None = None,
) -> None:
    import asyncio
    import contextlib
    import functools
    import random
    import signal

    from llmgw import __version__
    from llmgw.agent.addresses import EngineAddresses
    from llmgw.agent.backoff import Backoff
    from llmgw.agent.connection import Connection
    from llmgw.agent.feed import StatusFeed
    from llmgw.agent.hardware import Hardware, discover_gpus, load_nvml
    from llmgw.agent.hub import Snapshots
    from llmgw.agent.node import run_node
    from llmgw.agent.settings import ConnectionSettings, SupervisorSettings
    from llmgw.agent.supervisor import Supervisor
    from llmgw.agent.wire import NodeIdentity
    from llmgw.diagnostics import install_stack_dump
    from llmgw.engines import adapter_for
    from llmgw.lifecycle import guard

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # No HTTP listener here: SIGUSR1 writes every thread's and task's stack to the log.
    install_stack_dump(loop, log=log, file=sys.stderr, signum=signal.SIGUSR1)

    gpus = await asyncio.to_thread(
        discover_gpus,
        nvml=load_nvml(),
        declared=options.declared_gpus,
        node_id=options.node_id,
    )
    keeper = None
    if creds is not None:
        from datetime import UTC, datetime

        from llmgw.agent.enroll import CertificateKeeper, TlsStore, describe_expiry

        keeper = CertificateKeeper(
            creds=creds,
            store=TlsStore(options.state_dir),
            addresses=options.addresses,
            clock=lambda: datetime.now(UTC),
            silent=silent,
        )
    try:
        inventory = await asyncio.to_thread(gpus.inventory)
        if creds is not None:
            log.info(
                "dialling the control plane with mTLS as %s (certificate from the cluster CA, "
                "valid until %s, renewed after two thirds of its lifetime)",
                options.node_id,
                describe_expiry(creds),
            )
        elif options.tls is None:
            log.info("dialling the control plane in plaintext (no --token, no --tls-* flags)")
        else:
            log.info(
                "dialling the control plane with mTLS as %s (certificate names: %s)",
                options.node_id,
                ", ".join(options.tls.names),
            )
        log.info(
            "node %s: %d GPUs (%s), engines on ports %s, weights in %s",
            options.node_id,
            len(inventory),
            gpus.source,
            options.port_range,
            options.weights_dir,
        )
        supervisor_settings = SupervisorSettings(adopt_grace_seconds=options.adopt_grace)
        feed = StatusFeed()
        engine_addresses = EngineAddresses(
            advertise_host=options.advertise_host, engine_host=options.engine_host
        )
        snapshots = Snapshots(
            weights_dir=options.weights_dir,
            environ=os.environ,
            token_file=options.hub_token_file,
        )
        supervisor = Supervisor(
            adapters=functools.partial(adapter_for, settings=_engine_settings(options)),
            port_range=options.port_range,
            advertise_host=engine_addresses,
            weights_dir=options.weights_dir,
            gpu_count=len(inventory),
            settings=supervisor_settings,
            on_change=feed.publish,
            store=store,
            snapshots=snapshots,
            weights_limit=options.weights_limit,
        )
        connection = Connection(
            addresses=options.addresses,
            identity=NodeIdentity(
                node_id=options.node_id,
                hostname=socket.gethostname(),
                agent_version=__version__,
                # The flags' labels, then the join token's: the server holds the node
                # to its token's values whatever the agent declares.
                labels=_token_labels_win(options.labels, creds.labels if creds is not None else {}),
                fabric=options.fabric,
                port_range=options.port_range,
                weights_dir=options.weights_dir,
                weights_limit=options.weights_limit,
                sleep_memory_max=options.sleep_memory_max,
            ),
            supervisor=supervisor,
            feed=feed,
            hardware=Hardware(gpus=gpus, weights_dir=options.weights_dir),
            snapshots=snapshots,
            backoff=Backoff(rng=random.Random()),
            settings=ConnectionSettings(
                connect_timeout_seconds=options.dial_timeout,
                register_timeout_seconds=options.register_timeout,
            ),
            tls=keeper.material if keeper is not None else options.tls,
            engine_addresses=engine_addresses,
            silent=silent,
        )
        renewal = (
            None
            if keeper is None
            else asyncio.create_task(guard("certificate renewal", keeper.run()))
        )
        try:
            await run_node(
                supervisor=supervisor,
                connection=connection,
                stop=stop,
                grace_seconds=supervisor_settings.default_grace_seconds,
                stop_engines=options.stop_engines_on_exit,
            )
        finally:
            if renewal is not None:
                renewal.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await renewal
    finally:
        await asyncio.to_thread(gpus.close)
