"""A canary: a model with two versions split by weight, then promoted, then aborted.

A real `llmgw server`, a real agent with four declared GPUs and `llmgw sim`
engines (zero delays). The model has three pinned replicas; its own spec's sims
answer 3 tokens and its canary's 5 (`--output-tokens`) when a request sets no
`max_tokens`, so each reply's usage says which version served it. In order:

1. `versions:` with weights 90 and 10: the reconciler runs both (two replicas of
   the model's own spec, one of the canary's), `models show` lists both;
2. 200 new conversations split near the weights (10% ± 6 to the canary); every
   turn of a conversation and every request of a session stays on its version;
   usage records and the `llmgw_requests` metric carry the version;
3. `llmgw models rollout promote` under steady load: 0 failed requests, every
   replica ends on the canary's spec, the canary is gone from the catalog;
4. a new canary, then `llmgw models rollout abort` under load: 0 failed requests,
   the canary's replica drains and the model's own spec serves everything.

And a canary whose engine exits at once stops under load: 0 failed requests, it is not
started again, the model's own spec serves with every replica, and `models show`,
`rollout status`, the dashboard and the events say why, also after a restart of the
server; `abort` ends it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
from procs import Proc, Server, free_port, free_port_block, llmgw, wait_for
from rolling import Load

CONFIG = (
    "control: {heartbeat_interval: 0.3, unreachable_after: 15, lost_after: 30, "
    "reconcile_interval: 0.5, retry_base: 1, retry_max: 4, activation_timeout: 60, "
    "stop_grace: 5}\n"
    "router: {health: {interval: 0.5}}\n"
    # A server serves only with a catalog; the model under test is added through the API.
    "models:\n  - name: fixed\n    weights: none\n"
    "    profiles: [{name: sim, engine: sim, engine_args: [--zero-delay]}]\n"
)


def profile(tokens: int, *extra: str) -> dict[str, Any]:
    args = [*extra, "--zero-delay", "--output-tokens", str(tokens)]
    return {"name": "sim", "engine": "sim", "gpus": 1, "engine_args": args}


def spec(tokens: int, canary: int | None = None, *canary_args: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "can",
        "weights": "none",
        "min_replicas": 3,
        "max_replicas": 3,
        "keep_alive": -1,
        "profiles": [profile(tokens)],
    }
    if canary is not None:
        body["versions"] = [
            {"name": "stable", "weight": 90},
            {"name": "canary", "weight": 10, "profiles": [profile(canary, *canary_args)]},
        ]
    return body


def status(server: Server) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(server.admin + "/admin/api/models/can", timeout=10).json()[
        "status"
    ]
    return answer


def ready_tokens(server: Server) -> list[str]:
    """The `--output-tokens` of each Ready replica, sorted, once the router has them all
    and no replica is on its way in or out; [] otherwise."""
    now = status(server)
    replicas = now["replicas"]
    ready = [r for r in replicas if r["state"] == "ready"]
    healthy = [
        e
        for e in server.endpoints()
        if "can" in e["models"] and e["healthy"]  # type: ignore[operator]
    ]
    if len(ready) != len(replicas) or len(healthy) != len(ready) or now["rollout"] is not None:
        return []
    return sorted(r["engine_args"][-1] for r in ready)


def events(server: Server) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = httpx.get(
        f"{server.admin}/admin/api/events", params={"model": "can"}, timeout=10
    ).json()["events"]
    return found


def start_server(tmp_path: Path, agent_port: int) -> Server:
    config = tmp_path / "llmgw.yaml"
    config.write_text(CONFIG)
    return Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(config),
        data_dir=tmp_path / "data",
    )  # fmt: skip


def start_agent(tmp_path: Path, agent_port: int) -> Proc:
    """An agent with four declared GPUs and eight ports for the sims."""
    low = free_port_block(8)
    return Proc(
        llmgw(
            "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", "node-c",
            "--gpus", "4x24GiB", "--weights-dir", str(tmp_path / "weights"),
            "--port-range", f"{low}-{low + 7}",
        )
    )  # fmt: skip


def cli(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        llmgw(*args, "--admin", server.admin),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def ask(
    client: httpx.Client, server: Server, messages: list[dict[str, str]], **headers: str
) -> int:
    """One chat request; the completion tokens of its reply (which version served it)."""
    answer = client.post(
        server.url + "/v1/chat/completions",
        json={"model": "can", "messages": messages},
        headers=headers,
    )
    assert answer.status_code == 200, answer.text
    tokens: int = answer.json()["usage"]["completion_tokens"]
    return tokens


def test_a_canary_splits_by_weight_and_is_promoted_and_aborted_without_a_failed_request(
    tmp_path: Path,
) -> None:
    agent_port = free_port()
    server = start_server(tmp_path, agent_port)
    agent = start_agent(tmp_path, agent_port)
    try:
        # 1. Both versions run: 2 replicas of the model's own spec, 1 of the canary's.
        added = httpx.post(server.admin + "/admin/api/models", json=spec(3, canary=5), timeout=10)
        assert added.status_code == 201, added.text
        wait_for(lambda: ready_tokens(server) == ["3", "3", "5"], "both versions Ready", 90)
        versions = sorted(r["version"] for r in status(server)["replicas"])
        assert versions == ["canary", "stable", "stable"], versions
        shown = cli(server, "models", "show", "can")
        assert shown.returncode == 0, shown.stderr
        assert "stable: weight 90, the spec above" in shown.stdout, shown.stdout
        assert "canary: weight 10" in shown.stdout, shown.stdout
        assert "--output-tokens 5" in shown.stdout, shown.stdout
        page = httpx.get(server.admin + "/admin/models/can", timeout=10)
        assert page.status_code == 200, page.text
        assert page.text.count(">version canary<") == 1, page.text
        assert page.text.count(">version stable<") == 2, page.text
        told = cli(server, "models", "rollout", "status", "can")
        assert told.returncode == 0, told.stderr
        assert "canary:   canary (weight 10) beside stable (weight 90); 1 canary" in told.stdout

        # 2. The split: by conversation, near the weights; conversations and sessions stay.
        with httpx.Client(timeout=30) as client:
            firsts = [
                ask(client, server, [{"role": "user", "content": f"conversation {i}"}])
                for i in range(200)
            ]
            to_canary = firsts.count(5)
            assert set(firsts) == {3, 5}, firsts
            assert 8 <= to_canary <= 32, to_canary  # 10% of 200, give or take 6%
            for i in range(40):
                turns = [
                    {"role": "user", "content": f"conversation {i}"},
                    {"role": "assistant", "content": "w1 w2 w3"},
                    {"role": "user", "content": f"and then {i}?"},
                ]
                assert ask(client, server, turns) == firsts[i], i
            sessions = [
                {
                    ask(
                        client,
                        server,
                        [{"role": "user", "content": f"session {s} turn {t}"}],
                        **{"x-session-id": f"s-{s}"},
                    )
                    for t in range(3)
                }
                for s in range(40)
            ]
            assert all(len(seen) == 1 for seen in sessions), sessions
            assert {5} in sessions and {3} in sessions, sessions
        wait_for(
            lambda: (
                len(
                    httpx.get(
                        server.admin + "/admin/api/usage/requests",
                        params={"model": "can", "limit": "1000"},
                        timeout=10,
                    ).json()["requests"]
                )
                >= 200 + 40 + 120
            ),
            "the usage records to be written",
        )
        records = httpx.get(
            server.admin + "/admin/api/usage/requests",
            params={"model": "can", "limit": "1000"},
            timeout=10,
        ).json()["requests"]
        by_version = {(r["completion_tokens"], r["version"]) for r in records}
        assert by_version == {(3, "stable"), (5, "canary")}, by_version
        metrics = server.metrics()
        assert 'model="can",status="200",version="canary"' in metrics, metrics
        assert 'model="can",status="200",version="stable"' in metrics, metrics

        # 3. Promote under load: the canary's spec becomes the model's, the rest roll.
        with Load(server.url, "can", distinct=True) as load:
            wait_for(lambda: len(load.tokens) >= 20, "requests to flow")
            promoted = cli(server, "models", "rollout", "promote", "can")
            assert promoted.returncode == 0, promoted.stderr
            assert "the canary is its spec now" in promoted.stdout, promoted.stdout
            wait_for(lambda: ready_tokens(server) == ["5", "5", "5"], "the promotion", 120)
            sent = len(load.tokens)
            wait_for(lambda: len(load.tokens) >= sent + 20, "requests after the promotion")
        assert load.failures == [], load.failures[:5]
        assert load.tokens[-20:] == [5] * 20
        model = httpx.get(server.admin + "/admin/api/models/can", timeout=10).json()
        assert model["profiles"][0]["engine_args"][-1] == "5"
        assert "versions" not in model, model
        assert all(r["version"] is None for r in status(server)["replicas"])

        # 4. A new canary, then abort under load: its replica drains.
        changed = httpx.put(
            server.admin + "/admin/api/models/can", json=spec(5, canary=7), timeout=10
        )
        assert changed.status_code == 200, changed.text
        wait_for(lambda: ready_tokens(server) == ["5", "5", "7"], "the new canary", 120)
        with Load(server.url, "can", distinct=True) as load:
            wait_for(lambda: len(load.tokens) >= 20, "requests to flow")
            aborted = cli(server, "models", "rollout", "abort", "can")
            assert aborted.returncode == 0, aborted.stderr
            assert "the canary is dropped" in aborted.stdout, aborted.stdout
            wait_for(lambda: ready_tokens(server) == ["5", "5", "5"], "the abort", 120)
            sent = len(load.tokens)
            wait_for(lambda: len(load.tokens) >= sent + 20, "requests after the abort")
        assert load.failures == [], load.failures[:5]
        assert load.tokens[-20:] == [5] * 20
        assert "versions" not in httpx.get(server.admin + "/admin/api/models/can").json()
    except BaseException:
        print(server.proc.output())
        print(agent.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()


def test_a_failing_canary_stops_and_the_model_serves_on_until_it_is_aborted(
    tmp_path: Path,
) -> None:
    agent_port = free_port()
    server = start_server(tmp_path, agent_port)
    servers = [server]
    agent = start_agent(tmp_path, agent_port)
    try:
        added = httpx.post(server.admin + "/admin/api/models", json=spec(3), timeout=10)
        assert added.status_code == 201, added.text
        wait_for(lambda: ready_tokens(server) == ["3", "3", "3"], "the model Ready", 90)

        # A canary whose engine exits at once (`--max-running 0`), under load.
        with Load(server.url, "can", distinct=True) as load:
            wait_for(lambda: len(load.tokens) >= 20, "requests to flow")
            changed = httpx.put(
                server.admin + "/admin/api/models/can",
                json=spec(3, 5, "--max-running", "0"),
                timeout=10,
            )
            assert changed.status_code == 200, changed.text
            reason = wait_for(lambda: status(server)["canary_halt"], "the canary to stop", 90)
            # The model's own spec takes every replica again (one gave way to the canary).
            wait_for(lambda: ready_tokens(server) == ["3", "3", "3"], "three own replicas", 90)
            sent = len(load.tokens)
            wait_for(lambda: len(load.tokens) >= sent + 20, "requests after the stop")
        assert load.failures == [], load.failures[:5]
        assert set(load.tokens) == {3}
        assert "of canary 'canary' failed" in reason, reason
        assert "llmgw models rollout abort can" in reason, reason
        failures = [e for e in events(server) if e["kind"] == "failed"]
        assert len(failures) == 1, failures  # the canary was not started again
        assert any(
            e["kind"] == "rollout" and e["message"].startswith("canary stopped: replica")
            for e in events(server)
        ), events(server)
        shown = cli(server, "models", "show", "can")
        assert shown.returncode == 0, shown.stderr
        assert "canary stopped: replica" in shown.stdout, shown.stdout
        told = cli(server, "models", "rollout", "status", "can")
        assert told.returncode == 0, told.stderr
        assert "canary stopped: replica" in told.stdout, told.stdout
        assert "; 0 canary replica(s)" in told.stdout, told.stdout
        page = httpx.get(server.admin + "/admin/models/can", timeout=10)
        assert page.status_code == 200, page.text
        assert "Canary stopped: replica" in page.text, page.text

        # The stop is kept in the store: a restarted control plane keeps it stopped.
        ids = {r["id"] for r in status(server)["replicas"]}
        server.proc.stop()
        server = start_server(tmp_path, agent_port)
        servers.append(server)
        wait_for(
            lambda: ready_tokens(server) == ["3", "3", "3"] and status(server)["canary_halt"],
            "the restarted server to adopt the replicas, the canary still stopped",
            90,
        )
        with Load(server.url, "can", distinct=True) as load:
            wait_for(lambda: len(load.tokens) >= 20, "requests through the restarted server")
        assert load.failures == [], load.failures[:5]
        assert {r["id"] for r in status(server)["replicas"]} == ids
        assert [e for e in events(server) if e["kind"] in ("start", "failed")] == []

        # Abort drops the canary and its stop.
        aborted = cli(server, "models", "rollout", "abort", "can")
        assert aborted.returncode == 0, aborted.stderr
        assert "versions" not in httpx.get(server.admin + "/admin/api/models/can").json()
        wait_for(lambda: status(server)["canary_halt"] is None, "the stop to end")
        again = cli(server, "models", "rollout", "status", "can")
        assert "canary" not in again.stdout, again.stdout
        assert {r["id"] for r in status(server)["replicas"]} == ids
    except BaseException:
        for each in servers:
            print(each.proc.output())
        print(agent.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()


def test_canary_mistakes_get_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "llmgw.yaml").write_text(CONFIG)
    server = Server("--config", str(tmp_path / "llmgw.yaml"), data_dir=tmp_path / "data")
    try:
        added = httpx.post(server.admin + "/admin/api/models", json=spec(3), timeout=10)
        assert added.status_code == 201, added.text
        none = httpx.post(
            server.admin + "/admin/api/models/can/rollout/promote", json={}, timeout=10
        )
        assert none.status_code == 409, none.text
        assert none.json()["error"]["code"] == "no_canary"
        assert "has no canary" in none.json()["error"]["message"]
        told = cli(server, "models", "rollout", "abort", "can")
        assert told.returncode != 0 and "has no canary" in told.stderr, told.stderr
        assert "Traceback" not in told.stderr
        for versions, param, words in (
            ([{"name": "a", "weight": 90}], "versions", "exactly two"),
            (
                [{"name": "a", "weight": 90}, {"name": "b", "weight": 10}],
                "versions",
                "sets neither weights nor profiles",
            ),
            (
                [{"name": "a", "weight": 90}, {"name": "b", "weight": 0, "weights": "x"}],
                "versions.1.weight",
                "greater than or equal to 1",
            ),
            (
                [
                    {"name": "a", "weight": 90},
                    {"name": "b", "weight": 10, "profiles": [profile(3)]},
                ],
                "versions.1",
                "could not be told apart",
            ),
            (
                [
                    {"name": "a", "weight": 90},
                    {"name": "b", "weight": 10, "profiles": [{**profile(5), "engine": "nope"}]},
                ],
                "versions.1.profiles.0.engine",
                "nope",
            ),
        ):
            bad = httpx.post(
                server.admin + "/admin/api/models",
                json={**spec(3), "name": "bad", "versions": versions},
                timeout=10,
            )
            assert bad.status_code == 400, bad.text
            error = bad.json()["error"]
            assert error["param"] == param and words in error["message"], error
    except BaseException:
        print(server.proc.output())
        raise
    finally:
        server.proc.stop()
