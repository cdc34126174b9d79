"""What the listener guard costs a request: uvicorn's httptools protocol with and without it.

In one process, no network: each protocol is fed keep-alive requests through
an in-memory transport, and a minimal ASGI app answers each (reading its body
first). Blocks of requests alternate between the plain `HttpToolsProtocol`
and `GuardedHttpProtocol` (the gateway's), and the CPU time of this process
per request is compared: on a machine others share, CPU time counts only
this process's work, where req/s through a real gateway swings with every
neighbour (`router_overhead.py --before-src` measures that end to end).

Three requests: a GET without body; a POST with a 2 KiB JSON body in one
piece; the same body in 8 pieces (one parser callback each, where the guard
reads the clock). `--write` puts the table into bench/RESULTS.md.

Not guaranteed: the absolute µs (they include asyncio's own task overhead,
the same for both); only the difference between the two columns is the
guard's.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import uvloop
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sections import write_section

from llmgw.cli.listener_guard import ConnectionGate, protocol_for
from llmgw.config import HttpServerConfig

BODY = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 2000 + b'"}]}'
REQUESTS = {
    "GET, no body": [b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"],
    "POST, 2 KiB body in 1 piece": [
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(BODY)}\r\n\r\n".encode()
        + BODY
    ],
}
_head = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    + f"Content-Length: {len(BODY)}\r\n\r\n".encode()
)
_step = len(BODY) // 8 + 1
REQUESTS["POST, 2 KiB body in 8 pieces"] = [_head] + [
    BODY[i : i + _step] for i in range(0, len(BODY), _step)
]


class Transport(asyncio.Transport):
    """Takes writes and drops them; says when a response is complete."""

    def __init__(self) -> None:
        super().__init__()
        self.answered = 0
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if bytes(data).endswith(b"ok"):
            self.answered += 1

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8080)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def app(scope: Any, receive: Any, send: Any) -> None:
    while (await receive()).get("more_body"):
        pass
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


async def block(protocol_class: type[HttpToolsProtocol], pieces: list[bytes], count: int) -> float:
    """CPU seconds per request for `count` requests on one kept-alive connection."""
    config = Config(app, lifespan="off", log_config=None, access_log=False, ws="none")
    protocol = protocol_class(config=config, server_state=ServerState(), app_state={})
    transport = Transport()
    protocol.connection_made(transport)
    started = time.process_time()
    for n in range(1, count + 1):
        for piece in pieces:
            protocol.data_received(piece)
        # The app's task answers on the loop's next turns; yielding is the cheapest
        # wait, and the same for both protocols.
        while transport.answered < n:  # noqa: ASYNC110
            await asyncio.sleep(0)
        if transport.closed:
            raise RuntimeError("the connection was closed during the benchmark")
    spent = time.process_time() - started
    protocol.connection_lost(None)
    return spent / count


async def measure(rounds: int, count: int) -> dict[str, dict[str, list[float]]]:
    loop = asyncio.get_running_loop()
    gate = ConnectionGate(name="bench", limits=HttpServerConfig(), metrics=None, clock=loop.time)
    classes = {"without": HttpToolsProtocol, "with": protocol_for(gate)}
    results: dict[str, dict[str, list[float]]] = {}
    for label, pieces in REQUESTS.items():
        for round_ in range(rounds):
            order = list(classes.items()) if round_ % 2 == 0 else list(classes.items())[::-1]
            for name, cls in order:
                per = await block(cls, pieces, count)
                results.setdefault(label, {}).setdefault(name, []).append(per)
    return results


def render(
    results: dict[str, dict[str, list[float]]], rounds: int, count: int, command: str
) -> str:
    lines = [
        "## Listener guard: CPU per request in uvicorn's protocol, without and with it",
        "",
        f"Run {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, Python "
        f"{platform.python_version()}, `nproc` = {len(os.sched_getaffinity(0))}, "
        f"load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}.",
        "",
        f"Command: `{command}`",
        "",
        f"{rounds} blocks of {count:,} requests per protocol and request, alternating (the "
        "order flips each round); median of the blocks' CPU time per request.",
        "",
        "| request | without the guard | with the guard | added |",
        "|---|--:|--:|--:|",
    ]
    for label, by in results.items():
        off = statistics.median(by["without"]) * 1e6
        on = statistics.median(by["with"]) * 1e6
        lines.append(
            f"| {label} | {off:.2f} µs | {on:.2f} µs | {on - off:+.2f} µs ({on / off - 1:+.1%}) |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--write", action="store_true", help="write into bench/RESULTS.md")
    args = parser.parse_args()
    results = uvloop.run(measure(args.rounds, args.count))
    command = " ".join([".venv/bin/python bench/listener_guard.py", *sys.argv[1:]])
    body = render(results, args.rounds, args.count, command)
    print(body)
    if args.write:
        write_section("listener-guard", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
