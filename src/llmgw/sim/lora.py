"""Runtime LoRA adapters on the simulated engine, as vLLM serves them.

With `--enable-lora` the sim answers vLLM's runtime adapter API:
`POST /v1/load_lora_adapter {"lora_name", "lora_path"}` reads the adapter's
`adapter_config.json` under `lora_path` (its rank `r` must not exceed
`--max-lora-rank`), spends `--lora-load-time` seconds and registers the adapter;
`POST /v1/unload_lora_adapter {"lora_name"}` forgets it. A registered adapter is
listed in `/v1/models` with `parent` (the first served model) and `root` (its path),
and requests naming it are served, with its own prefix-cache entries and the base
model's counters (vLLM labels metrics with the base model too).

Slots: like vLLM's `--max-loras`, at most that many adapters are resident at once;
registering more is allowed (vLLM allows it too), but a request for an adapter that is
not resident waits `--lora-load-time` while it is swapped in, evicting the least
recently used one. Error messages show file system paths as `<path>`, as vLLM's
do. Successes answer in plain text and errors with vLLM 0.32's messages,
types and integer codes (a rank above the limit is refused by vLLM's engine core, which
its API server answers with 500), so the gateway handles the sim and vLLM alike.

Not guaranteed: the adapter's weights files are not read (only `adapter_config.json`);
a swap does not wait for requests using the evicted adapter (vLLM's scheduler does);
nothing is downloaded from a hub (a `lora_path` is a local directory).
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from llmgw.sim.asgi import Receive, Scope, Send, read_body, send_bytes, send_error
from llmgw.sim.errors import SimError
from llmgw.sim.scheduler import Clock, Sleep

_TEXT_HEADERS = ((b"content-type", b"text/plain; charset=utf-8"),)

# vLLM 0.32 hides file system paths in every error message it answers: absolute paths
# under these top-level directories, and any path to a file with an extension.
_SYSTEM_PATH = re.compile(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+")
_FILE_PATH = re.compile(r"(?:/[\w\-]+)+/[\w\-]+\.\w+")


def _hide_paths(message: str) -> str:
    return _FILE_PATH.sub("<path>", _SYSTEM_PATH.sub("<path>", message))


@dataclass(frozen=True, slots=True)
class Adapter:
    """A registered adapter: what `/v1/models` lists for it."""

    name: str
    path: str
    rank: int
    created: int


def _invalid(message: str) -> SimError:
    return SimError(400, message, code=400, error_type="InvalidUserInput")


def _not_found(message: str) -> SimError:
    return SimError(404, message, code=404, error_type="NotFoundError")


def _bad(message: str) -> SimError:
    return SimError(400, message, code=400, error_type="BadRequestError")


class LoraAdapters:
    """The registered adapters, the resident slots (LRU) and the two HTTP handlers."""

    def __init__(
        self,
        *,
        parent: str,
        served: Sequence[str],
        max_loras: int,
        max_lora_rank: int,
        load_time: float,
        sleep: Sleep,
        wall_clock: Clock,
    ) -> None:
        if max_loras < 1:
            raise ValueError(f"max_loras must be at least 1, got {max_loras}")
        if max_lora_rank < 1:
            raise ValueError(f"max_lora_rank must be at least 1, got {max_lora_rank}")
        self.parent = parent
        self._served = frozenset(served)
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self._load_time = load_time
        self._sleep = sleep
        self._wall_clock = wall_clock
        self._registered: dict[str, Adapter] = {}
        self._resident: OrderedDict[str, None] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self.running: dict[str, int] = {}
        # Loads done by the API plus swaps done for requests: what a test or a benchmark
        # reads to see whether a request had to wait for an adapter.
        self.loads = 0
        self.swaps = 0

    def get(self, name: str) -> Adapter | None:
        return self._registered.get(name)

    @property
    def registered(self) -> list[Adapter]:
        return list(self._registered.values())

    @property
    def resident(self) -> list[str]:
        return list(self._resident)

    def cards(self) -> list[dict[str, object]]:
        """The adapters' entries of `/v1/models`, as vLLM lists them."""
        return [
            {
                "id": adapter.name,
                "object": "model",
                "created": adapter.created,
                "owned_by": "llmgw-sim",
                "root": adapter.path,
                "parent": self.parent,
            }
            for adapter in self._registered.values()
        ]

    def _make_resident(self, name: str) -> None:
        self._resident[name] = None
        self._resident.move_to_end(name)
        while len(self._resident) > self.max_loras:
            self._resident.popitem(last=False)

    async def begin(self, name: str) -> None:
        """A request for adapter `name` starts: swap it in first if it is not resident."""
        if name in self._resident:
            self._resident.move_to_end(name)
        else:
            lock = self._locks.setdefault(name, asyncio.Lock())
            async with lock:
                if name not in self._resident and name in self._registered:
                    self.swaps += 1
                    if self._load_time > 0:
                        await self._sleep(self._load_time)
                    self._make_resident(name)
        self.running[name] = self.running.get(name, 0) + 1

    def end(self, name: str) -> None:
        left = self.running.get(name, 0) - 1
        if left > 0:
            self.running[name] = left
        else:
            self.running.pop(name, None)

    async def load(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = await _json_body(receive)
            if body is None:
                return
            name, path = body.get("lora_name"), body.get("lora_path")
            if not isinstance(name, str) or not isinstance(path, str) or not name or not path:
                raise _invalid("Both 'lora_name' and 'lora_path' must be provided.")
            lock = self._locks.setdefault(name, asyncio.Lock())
            async with lock:
                if name in self._served:
                    raise _invalid(f"The lora adapter '{name}' conflicts with a served base model.")
                if name in self._registered:
                    raise _invalid(
                        f"The lora adapter '{name}' has already been loaded. If you want to "
                        "load the adapter in place, set 'load_inplace' to True."
                    )
                rank = await asyncio.to_thread(_read_rank, name, path)
                if rank > self.max_lora_rank:
                    # vLLM's engine core refuses it, and its API server answers 500 with
                    # the failed call's words.
                    raise SimError(
                        500,
                        "Call to add_lora method failed: Worker failed with error 'LoRA rank "
                        f"{rank} is greater than max_lora_rank {self.max_lora_rank}.', please "
                        "check the stack trace above for the root cause",
                        code=500,
                        error_type="InternalServerError",
                    )
                if self._load_time > 0:
                    await self._sleep(self._load_time)
                self._registered[name] = Adapter(name, path, rank, int(self._wall_clock()))
                self._make_resident(name)
                self.loads += 1
        except SimError as exc:
            exc.message = _hide_paths(exc.message)
            await send_error(send, exc)
            return
        message = f"Success: LoRA adapter '{name}' added successfully."
        await send_bytes(send, 200, message.encode(), _TEXT_HEADERS)

    async def unload(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = await _json_body(receive)
            if body is None:
                return
            name = body.get("lora_name")
            if not isinstance(name, str) or not name:
                raise _invalid("'lora_name' needs to be provided to unload a LoRA adapter.")
            if self._registered.pop(name, None) is None:
                raise _not_found(f"The lora adapter '{name}' cannot be found.")
            self._resident.pop(name, None)
            self._locks.pop(name, None)
        except SimError as exc:
            await send_error(send, exc)
            return
        message = f"Success: LoRA adapter '{name}' removed successfully."
        await send_bytes(send, 200, message.encode(), _TEXT_HEADERS)

    def snapshot(self) -> dict[str, object]:
        """The `/sim/stats` part about adapters."""
        return {
            "max_loras": self.max_loras,
            "registered": [adapter.name for adapter in self._registered.values()],
            "resident": self.resident,
            "loads": self.loads,
            "swaps": self.swaps,
        }


async def _json_body(receive: Receive) -> dict[str, Any] | None:
    raw = await read_body(receive)
    if raw is None:
        return None
    try:
        body = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError as exc:
        raise _bad(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    return body


def _read_rank(name: str, path: str) -> int:
    """The rank `r` in `path`/adapter_config.json; vLLM's errors when it cannot be read."""
    config = Path(path) / "adapter_config.json"
    try:
        raw = config.read_bytes()
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise _not_found(f"Loading lora {name} failed: No adapter found for {path}") from exc
    except OSError as exc:
        raise _bad(f"Loading lora {name} failed: cannot read {config}: {exc.strerror}") from exc
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _bad(f"Loading lora {name} failed: {config} is not valid JSON: {exc}") from exc
    rank = data.get("r") if isinstance(data, dict) else None
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise _bad(f"Loading lora {name} failed: {config} has no positive integer rank 'r'")
    return rank
