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
    """Chat requests one after another until stopped, without max_tokens: each reply's
    completion tokens say which arguments served it. Every failure is kept."""

    def __init__(self, url: str, model: str = "roll") -> None:
        self.url = url
        self.model = model
        self.sent = 0
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

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                try:
                    answer = client.post(
                        self.url + "/v1/chat/completions",
                        json={"model": self.model, "messages": [{"role": "user", "content": "hi"}]},
                    )
                    if answer.status_code == 200:
                        self.tokens.append(answer.json()["usage"]["completion_tokens"])
                    else:
                        self.failures.append(f"{answer.status_code} {answer.text}")
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                self.sent += 1
                time.sleep(0.01)


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
