"""End users through real `llmgw server` routers, a real `llmgw sim`, PostgreSQL and Redis.

An end user is the `user` a request names (Anthropic: `metadata.user_id`). A key's
end-user limits hold each end user of its application on their own: across two
routers sharing Redis, in one router's memory without Redis, on every client API.
A request one end user is refused is charged to nobody (not the key, not the
team). Usage by end user adds up to the requests' records; hostile `user` values
are refused or stored harmlessly, and reports show them as text.
"""

from __future__ import annotations

import csv
import io
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from clitools import KeyedSim, cli, error_of, keyed_sim, made
from procs import require_redis, wait_for

Apps = KeyedSim


def _apps(store: list[str], tmp: Path) -> Iterator[Apps]:
    model = f"m-{secrets.token_hex(3)}"
    made("teams", "create", f"t-{model}", "--rpm", "1000", *store)
    yield from keyed_sim(
        store, tmp, model,
        [
            ("chat", ["--user-rpm", "2"]),
            ("frugal", ["--user-budget", "1"]),
            ("shared", ["--rpm", "3", "--user-rpm", "1", "--team", f"t-{model}"]),
            ("free", []),
            ("admin", ["--role", "admin"]),
        ],
    )  # fmt: skip


@pytest.fixture
def pg_apps(database: str, tmp_path: Path) -> Iterator[Apps]:
    require_redis()
    yield from _apps(["--store", database], tmp_path)


@pytest.fixture
def apps(tmp_path: Path) -> Iterator[Apps]:
    yield from _apps(["--data-dir", str(tmp_path / "data")], tmp_path)


def _refused_for(answer: httpx.Response, end_user: str, key: str, what: str) -> dict[str, Any]:
    assert answer.status_code == 429, answer.text
    error = error_of(answer)
    assert f"end user '{end_user}' of API key '{key}'" in error["message"], error
    assert what in error["message"], error
    assert int(answer.headers["retry-after"]) >= 1
    return error


def test_end_user_limits_hold_across_two_routers_and_usage_by_end_user_adds_up(
    pg_apps: Apps,
) -> None:
    apps = pg_apps
    a, b = apps.router(), apps.router()
    try:
        # Key chat: each end user may make 2 requests a minute, on both routers together.
        assert apps.ask(a, "chat", "alice").status_code == 200
        assert apps.ask(b, "chat", "alice").status_code == 200
        error = _refused_for(
            apps.ask(a, "chat", "alice"), "alice", "chat", "requests per minute (RPM): limit 2"
        )
        assert error["code"] == "rate_limit_exceeded"
        # Another end user of the same key, and the key without an end user, are not held.
        assert apps.ask(b, "chat", "bob").status_code == 200
        assert apps.ask(a, "chat").status_code == 200
        # Alice is the same end user on the Anthropic and Responses APIs.
        messages = httpx.post(
            b.url + "/v1/messages",
            json={"model": apps.model, "max_tokens": 4, "metadata": {"user_id": "alice"},
                  "messages": [{"role": "user", "content": "hi"}]},
            headers={"x-api-key": apps.secrets["chat"], "anthropic-version": "2023-06-01"},
            timeout=60,
        )  # fmt: skip
        assert messages.status_code == 429, messages.text
        assert "end user 'alice' of API key 'chat'" in messages.text
        responses = httpx.post(
            a.url + "/v1/responses",
            json={"model": apps.model, "input": "hi", "user": "alice", "max_output_tokens": 16},
            headers={"authorization": f"Bearer {apps.secrets['chat']}"},
            timeout=60,
        )
        assert responses.status_code == 429, responses.text
        assert "end user 'alice' of API key 'chat'" in responses.text

        # Key frugal: each end user may use 1 token a day; carol's first request spends it.
        assert apps.ask(a, "frugal", "carol").status_code == 200
        error = _refused_for(apps.ask(b, "frugal", "carol"), "carol", "frugal", "Token budget")
        assert error["code"] == "insufficient_quota"
        assert "tokens used this day (UTC)" in error["message"]
        assert "raise the key's end-user budget" in error["message"]
        assert apps.ask(b, "frugal", "dave").status_code == 200

        # Key shared (3 a minute; 1 per end user): a request refused for its end user is
        # charged to nobody, so three other end users still get through.
        assert apps.ask(a, "shared", "u1").status_code == 200
        _refused_for(apps.ask(b, "shared", "u1"), "u1", "shared", "limit 1")
        assert apps.ask(a, "shared", "u2").status_code == 200
        assert apps.ask(b, "shared", "u3").status_code == 200
        over = apps.ask(a, "shared", "u4")
        assert over.status_code == 429 and "key 'shared'" not in error_of(over)["message"]
        assert f"key '{apps.ids['shared']}'" in error_of(over)["message"]

        # Usage by end user: every request that named one, refused ones too, summed.
        admin = httpx.Client(
            base_url=a.admin,
            headers={"authorization": f"Bearer {apps.secrets['admin']}"},
            timeout=10,
        )
        with admin:
            expected = {"chat": 7, "frugal": 3, "shared": 5}

            def records() -> list[dict[str, Any]] | None:
                out: list[dict[str, Any]] = []
                for key, count in expected.items():
                    got = admin.get(
                        "/admin/api/usage/requests", params={"key": apps.ids[key]}
                    ).json()["requests"]
                    if len(got) != count:
                        return None
                    out += got
                return out

            recorded = wait_for(records, "every request's record", 30)
            sums: dict[tuple[str, str], list[int]] = {}
            for r in recorded:
                if r["end_user"] is None:
                    continue
                acc = sums.setdefault((r["key_name"], r["end_user"]), [0, 0, 0, 0])
                acc[0] += 1
                acc[1] += 1 if r["status"] >= 400 else 0
                acc[2] += r["prompt_tokens"]
                acc[3] += r["completion_tokens"]
            rows = admin.get("/admin/api/usage", params={"by": "key,end-user"}).json()["usage"]
            got = {
                (r["key_name"], r["end_user"]): [
                    r["requests"], r["errors"], r["prompt_tokens"], r["completion_tokens"]
                ]
                for r in rows
            }  # fmt: skip
            assert got == sums
            assert got[("chat", "alice")][:2] == [5, 3]
            assert got[("frugal", "carol")][:2] == [2, 1]
            # One end user, and a team's end users, through the same API.
            alice = admin.get(
                "/admin/api/usage", params={"by": "end-user", "end_user": "alice"}
            ).json()["usage"]
            assert [(r["end_user"], r["requests"]) for r in alice] == [("alice", 5)]
            team = admin.get(
                f"/admin/api/teams/t-{apps.model}/usage", params={"by": "end-user"}
            ).json()["usage"]
            assert {r["end_user"]: r["requests"] for r in team} == {
                "u1": 2, "u2": 1, "u3": 1, "u4": 1
            }  # fmt: skip
        # The CLI says the same.
        report = json.loads(made("usage", "--by", "key,end-user", "--json", *apps.store))
        assert {(r["key_name"], r["end_user"]): r["requests"] for r in report} == {
            k: v[0] for k, v in sums.items()
        }
        table = made("usage", "--by", "end-user", "--key", "chat", *apps.store)
        assert "END-USER" in table and "alice" in table and "bob" in table
        latest = made("usage", "--requests", "2", "--key", "chat", *apps.store)
        assert "END USER" in latest.splitlines()[0]
        assert all("alice" in line for line in latest.splitlines()[1:])
    except BaseException:
        print(a.proc.output())
        print(b.proc.output())
        raise
    finally:
        a.proc.stop()
        b.proc.stop()


def test_end_user_limits_without_redis_and_hostile_end_users(apps: Apps) -> None:
    server = apps.router(redis=False)
    try:
        assert apps.ask(server, "chat", "eve").status_code == 200
        assert apps.ask(server, "chat", "eve").status_code == 200
        _refused_for(apps.ask(server, "chat", "eve"), "eve", "chat", "limit 2")

        # Too long: refused with a 400 naming the field, before anything is charged.
        long = apps.ask(server, "chat", "x" * 257)
        assert long.status_code == 400, long.text
        assert error_of(long)["param"] == "user"
        assert "257 characters long; an end user has at most 256" in error_of(long)["message"]
        nuls = apps.ask(server, "chat", "\x00" * 100)
        assert nuls.status_code == 400 and "once its non-printable" in error_of(nuls)["message"]
        assert apps.ask(server, "chat", 7).status_code == 400
        # Anything else is an end user like any other, held to its own limits.
        hostile = [
            "y" * 256,
            "bob\x00'; DROP TABLE usage_records; --",
            '=HYPERLINK("http://evil")',
            "line\nbreak\u202e",
            "🙂 ünïcödé",
            "{tag}:r",
        ]
        for user in hostile:
            answer = apps.ask(server, "free", user)
            assert answer.status_code == 200, (user, answer.text)
        assert apps.ask(server, "chat", "{tag}:r").status_code == 200
        assert apps.ask(server, "shared", "teammate").status_code == 200
        # A made-up end user per request does not wear down the others.
        for i in range(5):
            assert apps.ask(server, "chat", f"made-up-{i}").status_code == 200

        admin = httpx.Client(
            base_url=server.admin,
            headers={"authorization": f"Bearer {apps.secrets['admin']}"},
            timeout=10,
        )
        with admin:

            def free_rows() -> list[dict[str, Any]] | None:
                rows: list[dict[str, Any]] = admin.get(
                    "/admin/api/usage", params={"by": "end-user", "key": apps.ids["free"]}
                ).json()["usage"]
                return rows if len(rows) == len(hostile) else None

            rows = wait_for(free_rows, "the hostile end users' usage", 30)
            shown = {r["end_user"] for r in rows}
            assert "bob\\x00'; DROP TABLE usage_records; --" in shown
            assert "line\\x0abreak\\u202e" in shown
            assert {"y" * 256, "🙂 ünïcödé", "{tag}:r", '=HYPERLINK("http://evil")'} <= shown
            assert all(r["requests"] == 1 for r in rows)
            # The dashboard's CSV keeps a formula-looking end user as text.
            exported = admin.get("/admin/usage.csv", params={"by": "key,end-user"})
            assert exported.status_code == 200, exported.text
            table = list(csv.DictReader(io.StringIO(exported.text)))
            assert '\'=HYPERLINK("http://evil")' in {r["end_user"] for r in table}

            # Usage by team in the CSV: the team's name, its keys' requests.
            # The shared key's one request is recorded on its own time, like any other.
            def team_rows() -> dict[str, dict[str, str]] | None:
                by_team = admin.get("/admin/usage.csv", params={"by": "team"})
                rows = {r["team"]: r for r in csv.DictReader(io.StringIO(by_team.text))}
                return rows if f"t-{apps.model}" in rows else None

            teams = wait_for(team_rows, "the shared key's request in the usage by team", 30)
            assert teams[f"t-{apps.model}"]["requests"] == "1"
            assert teams[""]["team_id"] == ""  # the keys in no team
            page = admin.get("/admin/usage")
            assert page.status_code == 200
            assert "Top end users" in page.text and "By team" in page.text
            assert "=HYPERLINK(&#34;http://evil&#34;)" in page.text
    except BaseException:
        print(server.proc.output())
        raise
    finally:
        server.proc.stop()


def test_keys_cli_sets_and_refuses_end_user_limits(tmp_path: Path) -> None:
    store = ["--data-dir", str(tmp_path / "data")]
    made("keys", "create", "--name", "k", "--user-rpm", "5", "--user-budget", "1000", *store)
    listed = made("keys", "list", *store)
    assert "user_rpm=5" in listed and "user_budget=1000/day" in listed
    made("keys", "update", "k", "--user-tpm", "70", "--no-user-rpm", *store)
    (key,) = json.loads(made("keys", "list", "--json", *store))
    assert (key["user_rpm"], key["user_tpm"], key["user_budget_tokens"]) == (None, 70, 1000)
    for args, message in (
        (("keys", "create", "--name", "z", "--user-rpm", "0"), "--user-rpm must be at least 1"),
        (("keys", "create", "--name", "z", "--user-budget", "-3"), "--user-budget must be"),
        (("keys", "update", "k", "--user-tpm", "3", "--no-user-tpm"), "--user-tpm sets what"),
        (("usage", "--by", "end-user", "--requests", "3"), "give one of them"),
        (("usage", "--by", "enduser"), "use hour, day, team, key, end-user or model"),
    ):
        result = cli(*args, *store)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
