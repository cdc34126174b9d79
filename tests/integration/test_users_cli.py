"""`llmgw users` as an operator runs it: real processes, a real SQLite store."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

from procs import llmgw

PASSWORD = "correct horse battery staple"


def run(*args: str, data_dir: Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    return subprocess.run(
        [*llmgw(*args), "--data-dir", str(data_dir)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def ok(*args: str, data_dir: Path, stdin: str = "") -> str:
    result = run(*args, data_dir=data_dir, stdin=stdin)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def refused(*args: str, data_dir: Path, stdin: str = "", code: int = 2) -> str:
    result = run(*args, data_dir=data_dir, stdin=stdin)
    assert result.returncode == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def user_rows(data_dir: Path) -> list[dict[str, object]]:
    with sqlite3.connect(data_dir / "llmgw.db") as db:
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute("SELECT * FROM users ORDER BY created_at")]


def test_create_list_passwd_disable(tmp_path: Path) -> None:
    out = ok(
        "users",
        "create",
        "alice",
        "--admin",
        "--password-stdin",
        data_dir=tmp_path,
        stdin=PASSWORD + "\n",
    )
    assert "created admin user 'alice'" in out
    ok("users", "create", "bob", "--password-stdin", data_dir=tmp_path, stdin=PASSWORD + "-bob\n")

    (alice, bob) = user_rows(tmp_path)
    assert str(alice["password_hash"]).startswith("$argon2id$")
    assert PASSWORD not in str(alice["password_hash"])
    assert alice["admin"] == 1 and bob["admin"] == 0
    assert (alice["admin_role"], bob["admin_role"]) == ("admin", None)

    table = ok("users", "list", data_dir=tmp_path)
    assert table.splitlines()[0].split() == ["NAME", "ROLE", "LOGIN", "CREATED", "STATE"]
    assert table.splitlines()[1].split()[:3] == ["alice", "admin", "password"]
    assert table.splitlines()[2].split()[:2] == ["bob", "none"]
    assert "argon2" not in table
    listed = json.loads(ok("users", "list", "--json", data_dir=tmp_path))
    assert [(u["name"], u["admin"], u["role"], u["disabled_at"]) for u in listed] == [
        ("alice", True, "admin", None),
        ("bob", False, None, None),
    ]
    assert "password_hash" not in listed[0]

    ok(
        "users",
        "passwd",
        "alice",
        "--password-stdin",
        data_dir=tmp_path,
        stdin="another long password\n",
    )
    assert user_rows(tmp_path)[0]["password_hash"] != alice["password_hash"]

    assert "disabled user 'bob'" in ok("users", "disable", "bob", data_dir=tmp_path)
    listed = json.loads(ok("users", "list", "--json", data_dir=tmp_path))
    assert listed[1]["disabled_at"] is not None


def test_bad_input_gets_one_error_line_and_exit_2(tmp_path: Path) -> None:
    short = refused(
        "users", "create", "alice", "--password-stdin", data_dir=tmp_path, stdin="short pw\n"
    )
    assert "at least 12 characters" in short
    assert not (tmp_path / "llmgw.db").exists() or user_rows(tmp_path) == []

    ok("users", "create", "alice", "--password-stdin", data_dir=tmp_path, stdin=PASSWORD + "\n")
    duplicate = refused(
        "users", "create", "alice", "--password-stdin", data_dir=tmp_path, stdin=PASSWORD + "\n"
    )
    assert "a user named 'alice' already exists" in duplicate
    assert len(user_rows(tmp_path)) == 1

    assert "is not allowed" in refused(
        "users", "create", "al ice", "--password-stdin", data_dir=tmp_path, stdin=PASSWORD
    )
    assert "there is no user 'carol'" in refused("users", "disable", "carol", data_dir=tmp_path)
    assert "there is no user 'carol'" in refused(
        "users", "passwd", "carol", "--password-stdin", data_dir=tmp_path, stdin=PASSWORD
    )


def test_roles_are_given_changed_and_checked(tmp_path: Path) -> None:
    out = ok(
        "users", "create", "vera", "--role", "viewer", "--password-stdin",
        data_dir=tmp_path, stdin=PASSWORD + "\n",
    )  # fmt: skip
    assert "created viewer user 'vera'" in out
    assert [(u["name"], u["admin_role"], u["admin"]) for u in user_rows(tmp_path)] == [
        ("vera", "viewer", 0)
    ]
    assert "now has the role operator" in ok("users", "role", "vera", "operator", data_dir=tmp_path)
    assert user_rows(tmp_path)[0]["admin_role"] == "operator"
    assert "now has the role admin" in ok("users", "role", "vera", "admin", data_dir=tmp_path)
    assert (user_rows(tmp_path)[0]["admin_role"], user_rows(tmp_path)[0]["admin"]) == ("admin", 1)
    assert "now has the role none" in ok("users", "role", "vera", "none", data_dir=tmp_path)
    assert (user_rows(tmp_path)[0]["admin_role"], user_rows(tmp_path)[0]["admin"]) == (None, 0)

    bad = refused(
        "users", "create", "root", "--role", "root", "--password-stdin",
        data_dir=tmp_path, stdin=PASSWORD + "\n",
    )  # fmt: skip
    assert "role 'root' is not one of admin, operator, viewer" in bad
    both = refused(
        "users", "create", "ann", "--admin", "--role", "viewer", "--password-stdin",
        data_dir=tmp_path, stdin=PASSWORD + "\n",
    )  # fmt: skip
    assert "--admin means --role admin" in both
    assert "role 'king' is not one of" in refused(
        "users", "role", "vera", "king", data_dir=tmp_path
    )
    assert "there is no user 'carol'" in refused(
        "users", "role", "carol", "viewer", data_dir=tmp_path
    )
    assert [u["name"] for u in user_rows(tmp_path)] == ["vera"]


def test_an_unreachable_store_exits_1(tmp_path: Path) -> None:
    line = refused(
        "users",
        "list",
        "--store",
        "postgresql://postgres@127.0.0.1:1/none",
        data_dir=tmp_path,
        code=1,
    )
    assert "did not answer" in line
