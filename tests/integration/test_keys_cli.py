"""`llmgw keys`, `llmgw usage` and `llmgw db` as a user runs them: real processes, real SQLite."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sqlite3
import subprocess
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from procs import llmgw

from llmgw.store import UsageRecord, open_store, store_url


def run(
    *args: str, data_dir: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    argv = llmgw(*args)
    if data_dir is not None:
        argv += ["--data-dir", str(data_dir)]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**full_env, **(env or {})},
    )


def ok(*args: str, data_dir: Path) -> str:
    result = run(*args, data_dir=data_dir)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def refused(*args: str, data_dir: Path | None, code: int = 2) -> str:
    result = run(*args, data_dir=data_dir)
    assert result.returncode == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def key_rows(data_dir: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(data_dir / "llmgw.db") as db:
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute("SELECT * FROM api_keys ORDER BY created_at")]


def secret_of(stdout: str) -> str:
    (line,) = [line for line in stdout.splitlines() if line.startswith("secret: ")]
    return line.removeprefix("secret: ")


def test_create_list_revoke_rotate(tmp_path: Path) -> None:
    out = ok(
        "keys",
        "create",
        "--name",
        "team-a",
        "--models",
        "llama-8b,qwen-7b",
        "--rpm",
        "60",
        "--budget-tokens",
        "100000",
        "--period",
        "day",
        "--expires",
        "2099-01-01",
        data_dir=tmp_path,
    )
    secret = secret_of(out)
    assert secret.startswith("sk-llmgw-")
    assert out.count(secret) == 1
    assert "store it now; it cannot be shown again" in out
    (row,) = key_rows(tmp_path)
    assert row["name"] == "team-a"
    assert row["secret_hash"] == hashlib.sha256(secret.encode()).hexdigest()
    assert row["prefix"] == secret[:12]
    assert all(secret not in str(value) for value in row.values())

    created = json.loads(
        ok("keys", "create", "--name", "ops", "--admin", "--json", data_dir=tmp_path)
    )
    assert created["secret"].startswith("sk-llmgw-")
    assert created["is_admin"] is True
    assert created["models"] is None

    listing = ok("keys", "list", data_dir=tmp_path)
    header, *lines = listing.splitlines()
    assert header.split() == ["ID", "NAME", "PREFIX", "MODELS", "LIMITS", "EXPIRES", "STATE"]
    assert len(lines) == 2
    assert row["id"] in lines[0] and "team-a" in lines[0]
    assert secret[:12] + "…" in lines[0]
    assert "llama-8b,qwen-7b" in lines[0]
    assert "rpm=60 budget=100000/day" in lines[0]
    assert "2099-01-01 00:00" in lines[0] and "active" in lines[0]
    assert "active, admin" in lines[1]
    assert secret not in listing and row["secret_hash"] not in listing
    assert created["secret"] not in listing

    rotated = ok("keys", "rotate", "team-a", data_dir=tmp_path)
    new_secret = secret_of(rotated)
    assert new_secret != secret
    assert "store it now; it cannot be shown again" in rotated
    (row_after, _) = key_rows(tmp_path)
    assert row_after["id"] == row["id"]
    assert row_after["secret_hash"] == hashlib.sha256(new_secret.encode()).hexdigest()

    assert "revoked key" in ok("keys", "revoke", new_secret[:12], data_dir=tmp_path)
    assert "already revoked" in ok("keys", "revoke", row["id"], data_dir=tmp_path)
    remaining = json.loads(ok("keys", "list", "--json", data_dir=tmp_path))
    assert [k["name"] for k in remaining] == ["ops"]
    everything = json.loads(ok("keys", "list", "--all", "--json", data_dir=tmp_path))
    assert {k["name"]: k["state"] for k in everything} == {"team-a": "revoked", "ops": "active"}
    assert all("secret" not in k and "secret_hash" not in k for k in everything)


async def _write_usage(data_dir: Path, key_id: str) -> None:
    store = await open_store(store_url(data_dir, None))
    try:
        hour = datetime(2025, 3, 1, 10, 0, tzinfo=UTC)
        records = [
            UsageRecord(
                ts=hour + timedelta(minutes=10 * i),
                request_id=f"r{i}",
                key_id=key_id if i < 8 else None,
                model="llama-8b" if i % 2 else "qwen-7b",
                endpoint="ep",
                status=500 if i == 0 else 200,
                prompt_tokens=100,
                completion_tokens=20,
                latency_ms=40.0,
                ttft_ms=None,
                streamed=False,
            )
            for i in range(10)
        ]
        await store.usage.record_batch(records)
    finally:
        await store.close()


def test_usage_report(tmp_path: Path) -> None:
    created = json.loads(ok("keys", "create", "--name", "team-a", "--json", data_dir=tmp_path))
    asyncio.run(_write_usage(tmp_path, created["id"]))

    table = ok("usage", data_dir=tmp_path)
    header, *lines = table.splitlines()
    assert header.split() == [
        "KEY",
        "MODEL",
        "REQUESTS",
        "ERRORS",
        "PROMPT",
        "COMPLETION",
        "TOTAL",
        "MEAN",
        "MS",
    ]
    assert f"{created['id']} (team-a)" in table
    assert "(no key)" in table
    assert lines[-1].split()[:3] == ["TOTAL", "10", "1"]

    rows = json.loads(ok("usage", "--key", "team-a", "--by", "model", "--json", data_dir=tmp_path))
    assert rows == [
        {
            "model": "llama-8b",
            "requests": 4,
            "errors": 0,
            "prompt_tokens": 400,
            "completion_tokens": 80,
            "total_tokens": 480,
            "mean_latency_ms": 40.0,
        },
        {
            "model": "qwen-7b",
            "requests": 4,
            "errors": 1,
            "prompt_tokens": 400,
            "completion_tokens": 80,
            "total_tokens": 480,
            "mean_latency_ms": 40.0,
        },
    ]
    hours = json.loads(
        ok(
            "usage",
            "--by",
            "hour",
            "--since",
            "2025-03-01T11:00",
            "--until",
            "2025-03-02",
            "--json",
            data_dir=tmp_path,
        )
    )
    assert [(h["hour"], h["requests"]) for h in hours] == [("2025-03-01T11:00:00+00:00", 4)]
    days = ok("usage", "--by", "day,key", "--since", "2025-02-28", data_dir=tmp_path)
    header, *lines = days.splitlines()
    assert header.split()[:3] == ["DAY", "KEY", "REQUESTS"]
    assert lines[0].split()[:4] == ["2025-03-01", "(no", "key)", "2"]
    assert lines[1].split()[:4] == ["2025-03-01", created["id"], "(team-a)", "8"]
    assert "no usage recorded since" in ok("usage", "--since", "1h", data_dir=tmp_path)

    # Single requests, newest first, from the raw records.
    latest = ok("usage", "--requests", "3", "--key", "team-a", data_dir=tmp_path)
    header, *lines = latest.splitlines()
    assert header.split()[:5] == ["TIME", "KEY", "MODEL", "ROUTE", "STATUS"]
    assert [line.split()[:2] for line in lines] == [
        ["2025-03-01", "11:10:00"],
        ["2025-03-01", "11:00:00"],
        ["2025-03-01", "10:50:00"],
    ]
    assert all(line.split()[-1] in ("r7", "r6", "r5") for line in lines)
    listed = json.loads(
        ok("usage", "--requests", "100", "--model", "qwen-7b", "--json", data_dir=tmp_path)
    )
    assert [r["request_id"] for r in listed] == ["r8", "r6", "r4", "r2", "r0"]
    assert listed[-1]["status"] == 500
    assert listed[0]["key_id"] is None and listed[1]["key_name"] == "team-a"
    assert listed[1]["queue_ms"] == 0.0 and listed[1]["continued"] == 0
    assert "no requests recorded since" in ok(
        "usage", "--requests", "5", "--since", "1h", data_dir=tmp_path
    )


def test_db_upgrade_is_idempotent_and_env_selects_the_data_dir(tmp_path: Path) -> None:
    first = ok("db", "upgrade", data_dir=tmp_path)
    assert "is at revision" in first
    assert ok("db", "upgrade", data_dir=tmp_path) == first
    via_env = run("keys", "list", env={"LLMGW_DATA_DIR": str(tmp_path)})
    assert via_env.returncode == 0, via_env.stderr
    assert via_env.stdout.startswith("no keys")
    assert (tmp_path / "llmgw.db").exists()


def test_bad_input_gives_one_error_line_and_exit_2(tmp_path: Path) -> None:
    ok("db", "upgrade", data_dir=tmp_path)
    cases = {
        ("keys", "create", "--name", "x", "--budget-tokens", "1000"): (
            "error: --budget-tokens needs --period day|month"
        ),
        ("keys", "create", "--name", "x", "--rpm", "0"): "--rpm must be at least 1",
        ("keys", "create", "--name", "x", "--expires", "next week"): "--expires 'next week'",
        ("keys", "create", "--name", "x", "--expires", "2001-01-01"): ("--expires is in the past"),
        ("keys", "revoke", "nobody"): "no key has the id, name or prefix 'nobody'",
        ("keys", "rotate", "nobody"): "'nobody'",
        ("usage", "--since", "yesterday"): "--since 'yesterday'",
        ("usage", "--by", "week"): "--by 'week': use hour, day, team, key, end-user or model",
        ("usage", "--by", "hour,day"): "--by takes hour or day, not both",
        ("usage", "--key", "nobody"): "'nobody'",
        ("usage", "--requests", "0"): "--requests 0: give how many of the latest requests",
        ("usage", "--requests", "5", "--by", "key"): "--by groups the report; --requests lists",
        ("usage", "--requests", "5", "--key", "nobody"): "'nobody'",
    }
    # Independent commands: run them side by side, each starts a Python process.
    with ThreadPoolExecutor(max_workers=4) as pool:
        lines = dict(
            zip(cases, pool.map(lambda a: refused(*a, data_dir=tmp_path), cases), strict=True)
        )
    for args, wanted in cases.items():
        assert wanted in lines[args], (args, lines[args])
    ok("keys", "create", "--name", "dup", data_dir=tmp_path)
    assert "an active key named 'dup' already exists" in refused(
        "keys", "create", "--name", "dup", data_dir=tmp_path
    )
    assert "--store must be sqlite:///PATH or postgresql://USER@HOST/DB" in refused(
        "keys", "list", "--store", "mysql://h/db", data_dir=None
    )
    assert [r["name"] for r in key_rows(tmp_path)] == ["dup"]


def test_an_unreachable_store_exits_1(tmp_path: Path) -> None:
    line = refused(
        "keys", "list", "--store", "postgresql://postgres@127.0.0.1:1/x", data_dir=None, code=1
    )
    assert "did not answer" in line
    assert "check that it is running" in line


def test_update_sets_clears_and_keeps_fields(tmp_path: Path) -> None:
    created = json.loads(
        ok("keys", "create", "--name", "team-a", "--rpm", "5", "--json", data_dir=tmp_path)
    )
    (before,) = key_rows(tmp_path)

    out = ok(
        "keys",
        "update",
        "team-a",
        "--name",
        "team-b",
        "--models",
        "llama-8b,qwen-7b",
        "--tpm",
        "1000",
        "--budget-tokens",
        "5000",
        "--period",
        "day",
        "--expires",
        "2099-01-01",
        "--admin",
        data_dir=tmp_path,
    )
    first, header, row, *rest = out.splitlines()
    assert first == f"updated key {created['id']} ('team-b'); routers apply it within a few seconds"
    assert header.split() == ["ID", "NAME", "PREFIX", "MODELS", "LIMITS", "EXPIRES", "STATE"]
    assert rest == []
    assert "llama-8b,qwen-7b" in row and "rpm=5 tpm=1000 budget=5000/day" in row
    assert "2099-01-01 00:00" in row and "active, admin" in row
    (after,) = key_rows(tmp_path)
    assert (after["id"], after["secret_hash"], after["prefix"]) == (
        before["id"],
        before["secret_hash"],
        before["prefix"],
    )
    assert after["updated_at"] > before["updated_at"]

    # A budget alone keeps the period; flags not given keep their values.
    view = json.loads(
        ok("keys", "update", "team-b", "--budget-tokens", "9000", "--json", data_dir=tmp_path)
    )
    assert (view["budget_tokens"], view["budget_period"], view["rpm"]) == (9000, "day", 5)
    assert "secret" not in view

    cleared = json.loads(
        ok(
            "keys",
            "update",
            created["prefix"],
            "--all-models",
            "--no-rpm",
            "--no-tpm",
            "--no-budget",
            "--never-expires",
            "--no-admin",
            "--json",
            data_dir=tmp_path,
        )
    )
    assert {k: cleared[k] for k in ("models", "rpm", "tpm", "budget_tokens", "budget_period")} == {
        "models": None,
        "rpm": None,
        "tpm": None,
        "budget_tokens": None,
        "budget_period": None,
    }
    assert (cleared["expires_at"], cleared["is_admin"], cleared["name"]) == (None, False, "team-b")
    listing = ok("keys", "list", data_dir=tmp_path)
    assert "team-b" in listing and "*" in listing and " - " in listing and "never" in listing


def test_update_refuses_bad_and_conflicting_flags(tmp_path: Path) -> None:
    ok("keys", "create", "--name", "a", "--rpm", "5", data_dir=tmp_path)
    ok("keys", "create", "--name", "b", data_dir=tmp_path)
    ok("keys", "create", "--name", "gone", data_dir=tmp_path)
    ok("keys", "revoke", "gone", data_dir=tmp_path)
    before = key_rows(tmp_path)
    cases = {
        ("keys", "update", "a", "--rpm", "5", "--no-rpm"): (
            "error: --rpm sets what --no-rpm clears; give one of the two"
        ),
        ("keys", "update", "a", "--tpm", "5", "--no-tpm"): "--tpm sets what --no-tpm clears",
        ("keys", "update", "a", "--models", "m", "--all-models"): (
            "--models sets what --all-models clears"
        ),
        ("keys", "update", "a", "--period", "day", "--no-budget"): (
            "--period sets what --no-budget clears"
        ),
        ("keys", "update", "a", "--expires", "30d", "--never-expires"): (
            "--expires sets what --never-expires clears"
        ),
        ("keys", "update", "a"): "error: nothing to change: give at least one of --name",
        ("keys", "update", "a", "--rpm", "0"): "--rpm must be at least 1",
        ("keys", "update", "a", "--budget-tokens", "10"): (
            "--budget-tokens needs --period day|month"
        ),
        ("keys", "update", "a", "--period", "week"): "--period must be day or month",
        ("keys", "update", "a", "--expires", "2001-01-01"): "--expires is in the past",
        ("keys", "update", "a", "--name", "b"): "an active key named 'b' already exists",
        ("keys", "update", "gone", "--rpm", "1"): "is revoked and cannot be changed",
        ("keys", "update", "nobody", "--rpm", "1"): "no key has the id, name or prefix 'nobody'",
    }
    with ThreadPoolExecutor(max_workers=4) as pool:
        lines = dict(
            zip(cases, pool.map(lambda a: refused(*a, data_dir=tmp_path), cases), strict=True)
        )
    for args, wanted in cases.items():
        assert wanted in lines[args], (args, lines[args])
    assert key_rows(tmp_path) == before


def test_a_keys_admin_role_is_set_changed_and_checked(tmp_path: Path) -> None:
    viewer = json.loads(
        ok("keys", "create", "--name", "watch", "--role", "viewer", "--json", data_dir=tmp_path)
    )
    assert (viewer["admin_role"], viewer["is_admin"]) == ("viewer", False)
    assert "active, viewer" in ok("keys", "list", data_dir=tmp_path)
    (row,) = key_rows(tmp_path)
    assert (row["admin_role"], row["is_admin"]) == ("viewer", 0)

    changed = json.loads(
        ok("keys", "update", "watch", "--role", "operator", "--json", data_dir=tmp_path)
    )
    assert changed["admin_role"] == "operator"
    promoted = json.loads(ok("keys", "update", "watch", "--admin", "--json", data_dir=tmp_path))
    assert (promoted["admin_role"], key_rows(tmp_path)[0]["is_admin"]) == ("admin", 1)
    dropped = json.loads(
        ok("keys", "update", "watch", "--role", "none", "--json", data_dir=tmp_path)
    )
    assert (dropped["admin_role"], key_rows(tmp_path)[0]["is_admin"]) == (None, 0)

    bad = refused("keys", "create", "--name", "x", "--role", "root", data_dir=tmp_path)
    assert "--role must be admin, operator, viewer or none (a client key), got 'root'" in bad
    both = refused(
        "keys", "create", "--name", "x", "--admin", "--role", "viewer", data_dir=tmp_path
    )
    assert "--admin means --role admin" in both
    twice = refused("keys", "update", "watch", "--no-admin", "--role", "viewer", data_dir=tmp_path)
    assert "give one of the two" in twice
    assert [r["name"] for r in key_rows(tmp_path)] == ["watch"]
