"""Steady load and a watch on a model's routed replicas, for tests that roll a model.

`Load` sends chat requests one after another (no `max_tokens`, so each reply's
usage says which engine arguments served it) and keeps every failure; `Watch`
keeps the fewest healthy endpoints the router had for the model.
"""

from __future__ import annotations

import threading
import time

import httpx
from procs import Server


class Load:
    """Chat requests one after another until stopped; every failure is kept.

    Without `max_tokens` each reply's completion tokens say which engine arguments
    served it (`tokens`). With `distinct`, each request starts a new conversation
    (its own first message), so no session or prefix holds it to one replica.
    """

    def __init__(
        self,
        url: str,
        model: str = "roll",
        *,
        max_tokens: int | None = None,
        distinct: bool = False,
        pause: float = 0.01,
    ) -> None:
        self.url = url
        self.model = model
        self.max_tokens = max_tokens
        self.distinct = distinct
        self.pause = pause
        self.sent = 0
        self.longest = 0.0  # seconds, of the slowest request
        self.tokens: list[int] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _body(self) -> dict[str, object]:
        content = f"load {self.sent + 1}" if self.distinct else "hi"
        body: dict[str, object] = {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
        }
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        return body

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                began = time.monotonic()
                try:
                    answer = client.post(self.url + "/v1/chat/completions", json=self._body())
                    if answer.status_code == 200:
                        self.tokens.append(answer.json()["usage"]["completion_tokens"])
                    else:
                        self.failures.append(f"{answer.status_code} {answer.text}")
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                self.sent += 1
                self.longest = max(self.longest, time.monotonic() - began)
                time.sleep(self.pause)


class Watch:
    """The fewest healthy endpoints the router had for the model, looked at all along."""

    def __init__(self, server: Server, model: str = "roll") -> None:
        self.server = server
        self.model = model
        self.fewest = 1_000
        self.looks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.is_set():
            healthy = [
                e
                for e in self.server.endpoints()
                if self.model in e["models"] and e["healthy"]  # type: ignore[operator]
            ]
            self.fewest = min(self.fewest, len(healthy))
            self.looks += 1
            time.sleep(0.02)
