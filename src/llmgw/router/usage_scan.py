"""Finding the `usage` object in an engine's JSON without parsing the whole answer.

A completion's body can be large (long texts, logprobs); the router only needs
its `usage`. The object is located by text and only it is parsed. Usage objects
hold numbers and nested objects of numbers, never strings with braces, which is
what makes brace counting exact here; anything unexpected gives None.
"""

from __future__ import annotations

from typing import Any

import orjson

_MARKERS = (b'"usage":{', b'"usage": {')


def _object_at(data: bytes, start: int) -> bytes | None:
    """The balanced `{...}` starting at `start`, or None.

    Steps from one `}` to the next with `bytes.find` (C speed) and stops at the
    first closing brace that balances the ones opened since `start`.
    """
    limit = min(len(data), start + 4096)
    close = start
    while True:
        close = data.find(b"}", close + 1, limit)
        if close < 0:
            return None
        candidate = data[start : close + 1]
        if candidate.count(b"{") == candidate.count(b"}"):
            return candidate


def find_usage(data: bytes) -> dict[str, Any] | None:
    """The last `"usage": {...}` object in `data`, parsed; None when there is none."""
    for marker in _MARKERS:
        index = data.rfind(marker)
        if index < 0:
            continue
        raw = _object_at(data, index + len(marker) - 1)
        if raw is None:
            return None
        try:
            usage = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        return usage if isinstance(usage, dict) else None
    return None


def usages_in(data: bytes) -> list[dict[str, Any]]:
    """Every `"usage": {...}` object in `data`, in order (`"usage": null` is none)."""
    found: list[tuple[int, dict[str, Any]]] = []
    for marker in _MARKERS:
        index = data.find(marker)
        while index >= 0:
            start = index + len(marker) - 1
            raw = _object_at(data, start)
            usage: Any = None
            if raw is not None:
                try:
                    usage = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    usage = None
            if isinstance(usage, dict):
                found.append((start, usage))
            index = data.find(marker, start)
    found.sort(key=lambda item: item[0])
    return [usage for _, usage in found]
