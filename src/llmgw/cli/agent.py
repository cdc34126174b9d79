"""`llmgw agent`: the node agent's flags, and its composition root.

Flags are parsed into plain values first (a bad one is one `error:` line and
exit code 2); only then are gRPC, NVML and the engines imported and every
long-lived object built and wired, inside the command. With --tls-ca,
--tls-cert and --tls-key (all three or none) the files are read and checked
at that stage too, so a wrong path is an `error:` naming its flag, and the
node id defaults to the certificate's name (the only one the server accepts).

Not guaranteed: engines outliving the agent. They are stopped gracefully on
SIGTERM/SIGINT and killed by the kernel if the agent dies any other way.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from llmgw.agent.errors import FlagError
from llmgw.agent.flags import (
    PortRange,
    parse_gpus,
    parse_key_values,
    parse_port_range,
    parse_servers,
)

if TYPE_CHECKING:
    from llmgw.pki import TlsMaterial

log = logging.getLogger("llmgw.agent")

DEFAULT_WEIGHTS_DIR = "~/.local/share/llmgw/weights"


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
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Run the node agent: dial out to the control plane and run engines on command."""
    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise _fail(f"--log-level: {log_level!r} is not one of debug, info, warning, error")
    try:
        tls = _tls(ca=tls_ca, cert=tls_cert, key=tls_key)
        options = _Options(
            addresses=parse_servers(server, servers),
            node_id=_node_id(node_id, tls),
            tls=tls,
            labels=parse_key_values("--labels", labels),
            fabric=parse_key_values("--fabric", fabric),
            port_range=parse_port_range(port_range),
            declared_gpus=parse_gpus(gpus),
            advertise_host=_host("--advertise-host", advertise_host),
            engine_host=_host("--engine-host", engine_host),
            engine_python=_engine_python(engine_python),
            # Last: the only check with a side effect (it creates the directory).
            weights_dir=_weights_dir(weights_dir),
        )
    except FlagError as exc:
        raise _fail(str(exc)) from None
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import asyncio

    try:
        asyncio.run(_serve(options))
    except Exception as exc:
        # A loop's failure arrives as an ExceptionGroup, already logged by its guard.
        log.critical(
            "the agent stopped after an unexpected error",
            exc_info=not isinstance(exc, BaseExceptionGroup),
        )
        raise typer.Exit(code=1) from None


@dataclass(frozen=True, slots=True)
class _Options:
    """The parsed flags (plain values only)."""

    addresses: tuple[str, ...]
    node_id: str
    tls: TlsMaterial | None
    labels: dict[str, str]
    fabric: dict[str, str]
    weights_dir: Path
    port_range: PortRange
    declared_gpus: tuple[int, ...]
    advertise_host: str | None
    engine_host: str | None
    engine_python: str


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


def _node_id(value: str | None, tls: TlsMaterial | None) -> str:
    if value is None and tls is not None and tls.names:
        # With mTLS the server accepts only a name on the certificate: default to it.
        return tls.names[0]
    node_id = socket.gethostname() if value is None else value.strip()
    if not node_id or any(c.isspace() for c in node_id):
        raise FlagError("--node-id", f"{value!r} is not an id: give a non-empty word")
    return node_id


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


async def _serve(options: _Options) -> None:
    import asyncio
    import functools
    import random
    import signal

    from llmgw import __version__
    from llmgw.agent.addresses import EngineAddresses
    from llmgw.agent.backoff import Backoff
    from llmgw.agent.connection import Connection
    from llmgw.agent.feed import StatusFeed
    from llmgw.agent.hardware import Hardware, discover_gpus, load_nvml
    from llmgw.agent.node import run_node
    from llmgw.agent.settings import ConnectionSettings, SupervisorSettings
    from llmgw.agent.supervisor import Supervisor
    from llmgw.agent.wire import NodeIdentity
    from llmgw.engines import EngineSettings, adapter_for

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    gpus = await asyncio.to_thread(
        discover_gpus,
        nvml=load_nvml(),
        declared=options.declared_gpus,
        node_id=options.node_id,
    )
    try:
        inventory = await asyncio.to_thread(gpus.inventory)
        if options.tls is None:
            log.info("dialling the control plane in plaintext (no --tls-* flags)")
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
        supervisor_settings = SupervisorSettings()
        feed = StatusFeed()
        engine_addresses = EngineAddresses(
            advertise_host=options.advertise_host, engine_host=options.engine_host
        )
        supervisor = Supervisor(
            adapters=functools.partial(
                adapter_for, settings=EngineSettings(python=options.engine_python)
            ),
            port_range=options.port_range,
            advertise_host=engine_addresses,
            weights_dir=options.weights_dir,
            gpu_count=len(inventory),
            settings=supervisor_settings,
            on_change=feed.publish,
        )
        connection = Connection(
            addresses=options.addresses,
            identity=NodeIdentity(
                node_id=options.node_id,
                hostname=socket.gethostname(),
                agent_version=__version__,
                labels=options.labels,
                fabric=options.fabric,
                port_range=options.port_range,
                weights_dir=options.weights_dir,
            ),
            supervisor=supervisor,
            feed=feed,
            hardware=Hardware(gpus=gpus, weights_dir=options.weights_dir),
            backoff=Backoff(rng=random.Random()),
            settings=ConnectionSettings(),
            tls=options.tls,
            engine_addresses=engine_addresses,
        )
        await run_node(
            supervisor=supervisor,
            connection=connection,
            stop=stop,
            grace_seconds=supervisor_settings.default_grace_seconds,
        )
    finally:
        await asyncio.to_thread(gpus.close)
