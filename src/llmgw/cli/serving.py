"""Running several ASGI apps on pre-bound sockets in one event loop.

Sockets are bound before anything starts, so "address already in use" is a
clear CLI error naming the flag, not a log line from deep inside uvicorn.
Signals are handled by the caller, once, for every server of the process.
A listener with `tls` (certificate and key files, checked by `check_tls`
before binding) serves HTTPS. Every listener's connections go through
`listener_guard` (header and body timeouts, a connection cap).
"""

from __future__ import annotations

import contextlib
import gc
import os
import resource
import socket
import ssl
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import uvicorn

from llmgw.cli.listener_guard import ConnectionGate, protocol_for
from llmgw.config import ListenAddress


class ListenError(Exception):
    """A listener could not be bound; the message names the flag and address."""


@dataclass(frozen=True, slots=True)
class TLSFiles:
    cert: str
    key: str


@dataclass(slots=True)
class BoundListener:
    name: str
    flag: str
    sock: socket.socket
    tls: TLSFiles | None = None

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def url(self, host: str) -> str:
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        if ":" in shown:
            shown = f"[{shown}]"
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{shown}:{self.port}"


def check_tls(field: str, tls: TLSFiles) -> None:
    """Load the certificate and key once, so a bad file is a ListenError naming `field`."""
    for name, path in (("cert", tls.cert), ("key", tls.key)):
        if not os.path.isfile(path):
            raise ListenError(
                f"{field}.{name}: {path} does not exist; give the PEM files from your CA "
                "or `llmgw certs issue --server HOST`"
            )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(tls.cert, tls.key)
    except (OSError, ssl.SSLError) as exc:
        raise ListenError(
            f"{field}: cannot use certificate {tls.cert} with key {tls.key}: "
            f"{getattr(exc, 'reason', None) or exc}; they must be PEM files, and the key "
            "must belong to the certificate"
        ) from exc


def bind(
    name: str, flag: str, address: ListenAddress, *, tls: TLSFiles | None = None
) -> BoundListener:
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address.host, address.port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ListenError(
            f"cannot listen on {address} for the {name} listener ({flag}): "
            f"{exc.strerror or exc}; choose another address with {flag} HOST:PORT"
        ) from exc
    sock.setblocking(False)
    return BoundListener(name, flag, sock, tls)


def raise_open_files_limit(needed: int) -> str | None:
    """Raise this process's soft limit on open files to its hard limit (as Go's
    runtime does at start); a warning to log when it stays below `needed`.

    Many systems start services with a soft limit of 1024: far below what
    `server.max_connections` allows, and a listener out of file descriptors
    fails in accept() instead of answering 503.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        # Some kernels refuse an infinite soft limit for files: ask for what is needed.
        hard_target = max(soft, needed) if soft != resource.RLIM_INFINITY else soft
    else:
        hard_target = hard
    if soft != resource.RLIM_INFINITY and soft < hard_target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard_target, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return None
    return (
        f"this process may open {soft} files (ulimit -n), fewer than the {needed} its "
        "listeners may need at server.max_connections (a client and an engine connection "
        "each): raise the limit (LimitNOFILE= in a systemd unit, ulimit -n in a shell) or "
        "lower server.max_connections; past the limit new connections fail instead of "
        "getting 503"
    )


# Objects the collector counts (made minus freed) before a young collection: 10x
# CPython's 700. A server holds a few thousand young objects at any moment (every
# request in flight: its coroutines, buffers, spans); at 700 each young collection
# walked them all and promoted the living to the older generations, whose
# collections then walked them again (bench/RESULTS.md). Collected later instead,
# most are freed by then. The cost: garbage in reference cycles waits until 7,000
# objects are counted instead of 700, and so does the memory it holds.
YOUNG_THRESHOLD = 7000


def tune_garbage_collector() -> int:
    """Set up the garbage collector for serving, once start-up is done; the number of
    start-up objects frozen.

    Every object start-up made (modules, classes, functions, config: about
    170,000 in `llmgw server`) is moved out of the collector's generations, after
    one collection: they live as long as the process, yet every full collection
    walked them all (70-100 ms of CPU each, one every few seconds at a few thousand
    requests a second, twice as often when every request is traced); frozen, a full
    collection walks only what was made since (5-20 ms). A frozen object is still freed when
    its reference count drops to zero; only a reference cycle among start-up
    objects that becomes garbage later is never collected. The young generation's
    threshold is raised to YOUNG_THRESHOLD."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    return gc.get_freeze_count()


class QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to the process."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def make_server(
    app: Any, *, graceful_seconds: float, gate: ConnectionGate, tls: TLSFiles | None = None
) -> QuietServer:
    """A server for one listener; `gate` holds its timeouts and connection cap."""
    config = uvicorn.Config(
        app,
        http=protocol_for(gate),
        ws="none",
        loop="none",
        lifespan="off",
        access_log=False,
        log_config=None,
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=int(graceful_seconds),
        timeout_keep_alive=30,
        backlog=2048,
        proxy_headers=False,
        ssl_certfile=tls.cert if tls is not None else None,
        ssl_keyfile=tls.key if tls is not None else None,
    )
    return QuietServer(config)
