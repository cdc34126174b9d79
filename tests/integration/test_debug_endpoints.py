"""The debug endpoints and `llmgw debug` against a real `llmgw server` with real sims.

One server (open auth for /v1, users alice (admin) and bob (not) for the login
on the API port) in front of two `llmgw sim` processes: `fast` (zero delay, for
load) and `stuck` (its streams stall after one token). Waits poll with
deadlines; nothing asserts on durations.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from procs import Server, Sim, llmgw, wait_for

from llmgw.cli.serving import YOUNG_THRESHOLD

pytestmark = pytest.mark.timeout(240)

PASSWORD = "correct horse battery staple"
JSON = {"Content-Type": "application/json"}
COLLAPSED_LINE = re.compile(r"^\S.* \d+$")
ENDPOINTS = [
    ("GET", "tasks"),
    ("GET", "threads"),
    ("GET", "profile?seconds=1"),
    ("GET", "memory"),
    ("POST", "memory/trace"),
    ("DELETE", "memory/trace"),
]


@dataclass
class Gateway:
    server: Server
    fast: Sim
    stuck: Sim

    @property
    def admin(self) -> str:
        return self.server.admin

    def tracing(self) -> bool:
        body = httpx.get(self.admin + "/debug/memory?format=json&top=1", timeout=30).json()
        return bool(body["tracemalloc"]["tracing"])


def add_user(data_dir: Path, name: str, *, admin: bool) -> None:
    result = subprocess.run(
        [*llmgw("users", "create", name, "--password-stdin", "--data-dir", str(data_dir)),
         *(["--admin"] if admin else [])],
        input=PASSWORD + "\n", capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def login(server: Server, name: str) -> httpx.Client:
    client = httpx.Client(base_url=server.url, timeout=30)
    answer = client.post("/admin/login", data={"username": name, "password": PASSWORD})
    assert answer.status_code == 303, answer.text
    return client


@pytest.fixture(scope="module", name="gw")
def gateway_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp("debug") / "data"
    add_user(data, "alice", admin=True)
    add_user(data, "bob", admin=False)
    fast = Sim("--zero-delay", model="fast")
    stuck = Sim("--zero-delay", model="stuck")
    server: Server | None = None
    try:
        stuck.faults(stall_after_tokens=1)
        server = Server(
            "--endpoint", f"f={fast.url}=fast", "--endpoint", f"s={stuck.url}=stuck",
            data_dir=data,
        )  # fmt: skip
        yield Gateway(server, fast, stuck)
    except BaseException:
        if server is not None:
            print(server.proc.output()[-5000:])
        raise
    finally:
        if server is not None:
            server.proc.stop()
        fast.proc.stop()
        stuck.proc.stop()


def _proxy_group(gw: Gateway) -> dict[str, Any] | None:
    body = httpx.get(gw.admin + "/debug/tasks?format=json", timeout=30).json()
    for group in body["groups"]:
        if any("in Proxy._relay_stream" in frame for frame in group["stack"]):
            return dict(group)
    return None


def test_stalled_streams_show_as_one_group_parked_in_the_proxy(gw: Gateway) -> None:
    assert _proxy_group(gw) is None
    body = {"model": "stuck", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with contextlib.ExitStack() as open_streams:
        client = open_streams.enter_context(httpx.Client(base_url=gw.server.url, timeout=60))
        readers = []  # kept: a reader dropped closes its stream
        for _ in range(3):
            response = open_streams.enter_context(
                client.stream("POST", "/v1/chat/completions", json=body)
            )
            assert response.status_code == 200
            readers.append(response.iter_raw())
            # The first token arrived; the engine now sends nothing more.
            assert b"data:" in next(readers[-1])
        group = wait_for(
            lambda: (g := _proxy_group(gw)) is not None and g["count"] == 3 and g,
            "the three stalled streams to show as one group",
        )
        assert group["states"] == {"pending": 3}
        stack = group["stack"]
        assert any(frame.startswith("llmgw/router/proxy.py:") for frame in stack)
        assert stack[-1].startswith("<awaiting ")
        text = httpx.get(gw.admin + "/debug/tasks", timeout=30).text
        assert "3 tasks (3 pending)" in text
        assert "in Proxy._relay_stream" in text
    # The streams are gone: so is their group.
    wait_for(lambda: _proxy_group(gw) is None, "the stalled streams' tasks to end")


def _load(gw: Gateway, stop: threading.Event) -> None:
    body = {"model": "fast", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=gw.server.url, timeout=120) as client:
        while not stop.is_set():
            assert client.post("/v1/chat/completions", json=body).status_code == 200


def _profiler_running(gw: Gateway) -> bool:
    body = httpx.get(gw.admin + "/debug/threads?format=json", timeout=30).json()
    return any("llmgw-profiler" in g["names"] for g in body["groups"])


def test_a_profile_under_load_names_the_routers_functions_and_only_one_runs(
    gw: Gateway,
) -> None:
    stop = threading.Event()
    loaders = [threading.Thread(target=_load, args=(gw, stop)) for _ in range(4)]
    answers: list[httpx.Response] = []
    profile = threading.Thread(
        # Long enough that the check below sees it running even on a starved machine.
        target=lambda: answers.append(httpx.get(gw.admin + "/debug/profile?seconds=10", timeout=90))
    )
    for t in loaders:
        t.start()
    try:
        profile.start()
        wait_for(lambda: _profiler_running(gw), "the profiler thread to start")
        second = httpx.get(gw.admin + "/debug/profile?seconds=1", timeout=60)
        assert second.status_code == 409, second.text
        error = second.json()["error"]
        assert error["code"] == "profile_running"
        assert "already running" in error["message"]
        profile.join(90)
    finally:
        stop.set()
        for t in loaders:
            t.join(60)
    [answer] = answers
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    assert int(answer.headers["x-llmgw-profile-samples"]) > 0
    lines = answer.text.splitlines()
    assert lines and all(COLLAPSED_LINE.match(line) for line in lines), lines[:3]
    router = [line for line in lines if re.search(r"\(llmgw/router/(proxy|app)\.py\)", line)]
    assert router, "no sample names llmgw/router/proxy.py or app.py:\n" + answer.text[:3000]
    assert all(line.startswith("MainThread;") for line in router)
    # The sampler never samples itself.
    assert not any(line.startswith("llmgw-profiler") for line in lines)


def test_memory_tracing_starts_reports_and_stops(gw: Gateway) -> None:
    plain = httpx.get(gw.admin + "/debug/memory?format=json", timeout=30).json()
    assert plain["rss_bytes"] > 0
    assert plain["tracemalloc"] == {"tracing": False}
    assert plain["allocations"] == []
    assert {"dict", "function"} <= {t["type"] for t in plain["types"]}
    # The server froze its start-up objects (modules, classes, functions): full
    # collections no longer walk them; and its young generation waits longer.
    assert plain["gc"]["frozen"] > 10_000
    assert plain["gc"]["thresholds"][0] == YOUNG_THRESHOLD

    started = httpx.post(gw.admin + "/debug/memory/trace?frames=5", headers=JSON, timeout=30)
    assert started.status_code == 200, started.text
    assert started.json()["tracing"] is True
    assert started.json()["frames"] == 5
    again = httpx.post(gw.admin + "/debug/memory/trace", headers=JSON, timeout=30)
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "already_tracing"

    traced = httpx.get(gw.admin + "/debug/memory?format=json&top=5", timeout=30).json()
    assert traced["tracemalloc"]["tracing"] is True
    assert 1 <= len(traced["allocations"]) <= 5
    site = traced["allocations"][0]
    assert site["size_bytes"] > 0 and site["count"] > 0 and site["traceback"]
    text = httpx.get(gw.admin + "/debug/memory", timeout=30).text
    assert "top allocation sites" in text and "RSS:" in text

    stopped = httpx.delete(gw.admin + "/debug/memory/trace", headers=JSON, timeout=30)
    assert stopped.json() == {"tracing": False, "was_tracing": True}
    after = httpx.get(gw.admin + "/debug/memory?format=json", timeout=30).json()
    assert after["tracemalloc"] == {"tracing": False}
    assert after["allocations"] == []
    assert "allocation tracing is off" in httpx.get(gw.admin + "/debug/memory", timeout=30).text


@pytest.mark.parametrize(
    ("method", "path", "param"),
    [
        ("GET", "/debug/profile?seconds=0", "seconds"),
        ("GET", "/debug/profile?seconds=61", "seconds"),
        ("GET", "/debug/profile?seconds=ten", "seconds"),
        ("GET", "/debug/profile?seconds=nan", "seconds"),
        ("GET", "/debug/profile?seconds=1&interval_ms=0", "interval_ms"),
        ("GET", "/debug/profile?seconds=1&idle=maybe", "idle"),
        ("GET", "/debug/profile?seconds=1&format=svg", "format"),
        ("GET", "/debug/tasks?format=yaml", "format"),
        ("GET", "/debug/threads?depth=3", "depth"),
        ("GET", "/debug/memory?top=0", "top"),
        ("GET", "/debug/memory?top=many", "top"),
        ("POST", "/debug/memory/trace?frames=0", "frames"),
        ("POST", "/debug/memory/trace?frames=101", "frames"),
    ],
)
def test_bad_parameters_get_a_400_naming_the_parameter(
    gw: Gateway, method: str, path: str, param: str
) -> None:
    answer = httpx.request(method, gw.admin + path, headers=JSON, timeout=30)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "invalid_parameter",
        param,
    )
    assert error["message"].startswith(param) or repr(param) in error["message"]
    assert gw.tracing() is False


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_the_api_port_refuses_without_an_admin_login(gw: Gateway, method: str, path: str) -> None:
    url = f"/admin/api/debug/{path}"
    anonymous = httpx.request(method, gw.server.url + url, headers=JSON, timeout=30)
    assert anonymous.status_code == 401, anonymous.text
    assert anonymous.json()["error"]["code"] == "login_required"
    with contextlib.closing(login(gw.server, "bob")) as bob:
        token = bob.get("/admin/api/session").json()["csrf_token"]
        refused = bob.request(method, url, headers={**JSON, "X-CSRF-Token": token})
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "admin_required"
    # Only on the admin listener and behind the login: never bare on the API port.
    assert httpx.get(gw.server.url + "/debug/tasks", timeout=30).status_code == 404
    assert gw.tracing() is False


def test_an_admin_logged_in_on_the_api_port_uses_them(gw: Gateway) -> None:
    with contextlib.closing(login(gw.server, "alice")) as alice:
        tasks = alice.get("/admin/api/debug/tasks?format=json")
        assert tasks.status_code == 200, tasks.text
        assert tasks.json()["kind"] == "tasks" and tasks.json()["total"] > 0
        token = alice.get("/admin/api/session").json()["csrf_token"]
        csrf = {**JSON, "X-CSRF-Token": token}
        # A change needs the session's CSRF token, as every admin change there does.
        assert alice.post("/admin/api/debug/memory/trace", headers=JSON).status_code == 403
        assert alice.post("/admin/api/debug/memory/trace", headers=csrf).status_code == 200
        assert gw.tracing() is True
        assert alice.delete("/admin/api/debug/memory/trace", headers=csrf).status_code == 200
        assert gw.tracing() is False


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({"Host": "evil.example"}, "host_not_allowed"),
        ({"Origin": "http://evil.example"}, "cross_origin_request"),
        ({"Sec-Fetch-Site": "cross-site"}, "cross_origin_request"),
    ],
    ids=["foreign-host", "foreign-origin", "cross-site"],
)
def test_the_admin_listener_refuses_foreign_hosts_and_other_origins(
    gw: Gateway, method: str, path: str, headers: dict[str, str], code: str
) -> None:
    for prefix in ("/debug/", "/admin/api/debug/"):
        answer = httpx.request(
            method, gw.admin + prefix + path, headers={**JSON, **headers}, timeout=30
        )
        assert answer.status_code == 403, answer.text
        error = answer.json()["error"]
        assert (error["type"], error["code"]) == ("permission_error", code)
    assert gw.tracing() is False


# ---- the CLI ----


def cli(gw: Gateway, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*llmgw("debug", *args), "--admin", gw.admin],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_cli_prints_tasks_threads_and_memory(gw: Gateway) -> None:
    tasks = cli(gw, "tasks")
    assert tasks.returncode == 0, tasks.stderr
    assert re.match(r"\d+ tasks in \d+ distinct stacks", tasks.stdout)
    assert "llmgw/" in tasks.stdout
    threads = cli(gw, "threads")
    assert threads.returncode == 0, threads.stderr
    assert "MainThread" in threads.stdout and "(1 current)" in threads.stdout
    memory = cli(gw, "memory", "--top", "3")
    assert memory.returncode == 0, memory.stderr
    assert memory.stdout.startswith("RSS: ") and "most common types" in memory.stdout
    assert "allocation tracing is off" in memory.stdout


def test_the_cli_starts_and_stops_memory_tracing(gw: Gateway) -> None:
    started = cli(gw, "memory", "--trace-start", "--frames", "3")
    assert started.returncode == 0, started.stderr
    assert "allocation tracing started (3 frames per allocation)" in started.stdout
    twice = cli(gw, "memory", "--trace-start")
    assert twice.returncode == 2
    assert "already running" in twice.stderr and "--trace-stop" in twice.stderr
    report = cli(gw, "memory", "--top", "3")
    assert "top allocation sites" in report.stdout
    stopped = cli(gw, "memory", "--trace-stop")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == "allocation tracing stopped"
    assert cli(gw, "memory", "--trace-stop").stdout.strip() == (
        "allocation tracing was not running; nothing to stop"
    )
    both = cli(gw, "memory", "--trace-start", "--trace-stop")
    assert both.returncode == 2 and "contradict" in both.stderr
    assert gw.tracing() is False


def test_the_cli_saves_a_profile(gw: Gateway, tmp_path: Path) -> None:
    out = tmp_path / "profile.txt"
    done = cli(gw, "profile", "--seconds", "1", "-o", str(out), "--idle")
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}" in done.stdout and "speedscope" in done.stdout
    assert "of a core" in done.stdout
    lines = out.read_text().splitlines()
    # With --idle every thread is counted, waiting or not: the event loop's among them.
    assert lines and all(COLLAPSED_LINE.match(line) for line in lines)
    assert any(line.startswith("MainThread;") for line in lines)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("0", "--seconds must be a number above 0 and at most 60"),
        ("61", "--seconds must be a number above 0 and at most 60"),
        ("ten", "Invalid value for '--seconds'"),
    ],
)
def test_the_cli_says_what_to_do_with_a_bad_profile_length(
    gw: Gateway, value: str, says: str
) -> None:
    done = cli(gw, "profile", "--seconds", value)
    assert done.returncode == 2
    assert says in done.stderr
    assert "Traceback" not in done.stderr
    if value != "ten":
        assert "pass e.g. --seconds 10" in done.stderr


def test_the_cli_says_when_the_server_is_not_there(tmp_path: Path) -> None:
    done = subprocess.run(
        [*llmgw("debug", "tasks"), "--admin", "http://127.0.0.1:9"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "cannot reach the admin API" in done.stderr and "Traceback" not in done.stderr
