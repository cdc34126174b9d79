"""Teams through real `llmgw server` routers, a real `llmgw sim`, PostgreSQL and Redis.

Teams, keys, users and memberships are made with the real CLI before the
servers start. Two routers share the store (PostgreSQL) and the limits (Redis):
a team's limit counts the requests of all its keys on both routers together,
and a refusal names the team and the limit. A team admin, logged in on the API
port, manages their own team's keys and sees its usage, and reaches nothing of
another team's. The CLI refuses bad input with a message and exit status 2.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from clitools import KeyedSim, cli, error_of, keyed_sim, made, made_all
from procs import Server, require_redis, wait_for

PASSWORD = "correct horse battery staple"


Fleet = KeyedSim


def _fleet(store: list[str], tmp: Path) -> Iterator[Fleet]:
    # Names of its own: other tests' routers on the same Redis never count here.
    tag = secrets.token_hex(3)
    model = f"m-{tag}"
    red, blue = f"red-{tag}", f"blue-{tag}"
    # In one process (clitools.made_all), as are the keys (keyed_sim).
    users = [
        (["users", "create", user, "--password-stdin", *store], PASSWORD + "\n")
        for user in ("ann", "bob", "carl")
    ]
    made_all(
        [
            *users,
            (["teams", "create", red, "--rpm", "2", *store], ""),
            (["teams", "create", blue, "--budget-tokens", "1", "--period", "day", *store], ""),
            (["teams", "members", "add", red, "ann", "--role", "team-admin", *store], ""),
            (["teams", "members", "add", blue, "bob", "--role", "team-admin", *store], ""),
            (["teams", "members", "add", red, "carl", *store], ""),
        ]
    )
    flags = {"red": ["--team", f"red-{tag}"], "blue": ["--team", f"blue-{tag}"]}
    made_keys = [
        ("red-1", flags["red"]), ("red-2", flags["red"]), ("blue-1", flags["blue"]),
        ("blue-2", flags["blue"]), ("solo", []), ("admin", ["--role", "admin"]),
    ]  # fmt: skip
    for fleet in keyed_sim(store, tmp, model, made_keys):
        fleet.ids["red"], fleet.ids["blue"] = f"red-{tag}", f"blue-{tag}"
        yield fleet


@pytest.fixture
def pg_fleet(database: str, tmp_path: Path) -> Iterator[Fleet]:
    require_redis()
    yield from _fleet(["--store", database], tmp_path)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    yield from _fleet(["--data-dir", str(tmp_path / "data")], tmp_path)


def test_team_limits_hold_across_two_routers_and_usage_by_team_adds_up(
    pg_fleet: Fleet,
) -> None:
    fleet = pg_fleet
    a, b = fleet.router(), fleet.router()
    try:
        # Team red: 2 requests a minute for all its keys, on both routers together.
        assert fleet.ask(a, "red-1").status_code == 200
        assert fleet.ask(b, "red-2").status_code == 200
        refused = fleet.ask(a, "red-2")
        assert refused.status_code == 429, refused.text
        error = error_of(refused)
        assert f"team '{fleet.ids['red']}'" in error["message"]
        assert "requests per minute (RPM): limit 2" in error["message"]
        assert error["code"] == "rate_limit_exceeded"
        assert int(refused.headers["retry-after"]) >= 1
        # A key outside the team is not held to it.
        assert fleet.ask(b, "solo").status_code == 200

        # Team blue: a budget of 1 token a day, used up by its first request (on A).
        assert fleet.ask(a, "blue-1").status_code == 200
        spent = fleet.ask(b, "blue-2")
        assert spent.status_code == 429, spent.text
        error = error_of(spent)
        assert error["code"] == "insufficient_quota"
        assert f"Token budget exhausted for team '{fleet.ids['blue']}'" in error["message"]
        assert "an administrator can raise the team's budget" in error["message"]

        # Usage by team: every request of its keys (refused ones too), tokens summed.
        admin = {"authorization": f"Bearer {fleet.secrets['admin']}"}

        def red_row() -> dict[str, Any] | None:
            rows = httpx.get(
                a.admin + "/admin/api/usage", params={"by": "team"}, headers=admin, timeout=10
            ).json()["usage"]
            return next((r for r in rows if r["team"] == fleet.ids["red"] and
                         r["requests"] == 3), None)  # fmt: skip

        row = wait_for(red_row, "team red's three requests in the usage", 30)
        records = []
        for key in ("red-1", "red-2"):
            answer = httpx.get(
                a.admin + "/admin/api/usage/requests",
                params={"key": fleet.ids[key]},
                headers=admin,
                timeout=10,
            )
            records += answer.json()["requests"]
        assert len(records) == 3
        assert sorted(r["status"] for r in records) == [200, 200, 429]
        assert row["prompt_tokens"] == sum(r["prompt_tokens"] for r in records) > 0
        assert row["completion_tokens"] == sum(r["completion_tokens"] for r in records) > 0
        assert row["errors"] == 1
        # The CLI says the same.
        report = json.loads(made("usage", "--by", "team", "--json", *fleet.store))
        assert {r["team"]: r["requests"] for r in report}[fleet.ids["red"]] == 3
    except BaseException:
        print(a.proc.output())
        print(b.proc.output())
        raise
    finally:
        a.proc.stop()
        b.proc.stop()


def _login(server: Server, name: str) -> tuple[httpx.Client, dict[str, str]]:
    client = httpx.Client(base_url=server.url, timeout=10)
    answer = client.post("/admin/login", data={"username": name, "password": PASSWORD})
    assert answer.status_code == 303, answer.text
    csrf: str = client.get("/admin/api/session").json()["csrf_token"]
    return client, {"X-CSRF-Token": csrf}


def test_a_team_admin_manages_only_their_own_team(fleet: Fleet) -> None:
    server = Server(
        "--endpoint", f"s={fleet.sim.url}={fleet.model}", *fleet.store, auth=True
    )  # fmt: skip
    red, blue = fleet.ids["red"], fleet.ids["blue"]
    try:
        ann, csrf = _login(server, "ann")
        with contextlib.closing(ann):
            own = ann.get(f"/admin/api/teams/{red}/keys")
            assert own.status_code == 200, own.text
            assert sorted(k["name"] for k in own.json()["keys"]) == ["red-1", "red-2"]
            assert all(k["team"] == red for k in own.json()["keys"])
            assert "secret" not in own.text

            # Nothing of team blue: not its keys, not a new key in it, not revoking its key.
            assert ann.get(f"/admin/api/teams/{blue}/keys").status_code == 403
            assert ann.get(f"/admin/api/teams/{blue}/usage").status_code == 403
            made_there = ann.post(f"/admin/api/teams/{blue}/keys", json={"name": "x"},
                                  headers=csrf)  # fmt: skip
            assert made_there.status_code == 403, made_there.text
            assert error_of(made_there)["code"] == "team_not_allowed"
            assert "that team's team-admins" in error_of(made_there)["message"]
            for ref in (fleet.ids["blue-1"], "blue-1"):
                sneaky = ann.post(
                    f"/admin/api/teams/{red}/keys/{ref}/revoke", json={}, headers=csrf
                )
                assert sneaky.status_code == 404, sneaky.text
            # Nor the gateway's keys, usage or teams.
            for path in ("/admin/api/keys", "/admin/api/usage", "/admin/api/teams",
                         f"/admin/api/teams/{red}"):  # fmt: skip
                assert ann.get(path).status_code == 403, path
            assert ann.patch(f"/admin/api/teams/{red}", json={"rpm": 100},
                             headers=csrf).status_code == 403  # fmt: skip

            # Their own team: a new key (in the team, working at once) and a revoke.
            new = ann.post(f"/admin/api/teams/{red}/keys", json={"name": "red-3"}, headers=csrf)
            assert new.status_code == 201, new.text
            assert new.json()["team"] == red
            fleet.secrets["red-3"] = new.json()["secret"]
            assert fleet.ask(server, "red-3").status_code == 200
            gone = ann.post(f"/admin/api/teams/{red}/keys/red-1/revoke", json={}, headers=csrf)
            assert gone.status_code == 200 and gone.json()["state"] == "revoked"
            usage = wait_for(
                lambda: ann.get(f"/admin/api/teams/{red}/usage").json()["usage"],
                "team red's usage",
                30,
            )
            assert {r["key_name"] for r in usage} == {"red-3"}

        # Team blue's keys are as they were.
        keys = json.loads(made("keys", "list", "--json", *fleet.store))
        assert {k["name"]: k["state"] for k in keys if k["team"] == blue} == {
            "blue-1": "active",
            "blue-2": "active",
        }

        # Admins move keys between teams through the admin API, by the team's name.
        admin = httpx.Client(
            base_url=server.admin,
            headers={"authorization": f"Bearer {fleet.secrets['admin']}"},
            timeout=10,
        )
        with admin:
            moved = admin.patch(f"/admin/api/keys/{fleet.ids['solo']}", json={"team": blue})
            assert moved.status_code == 200 and moved.json()["team"] == blue, moved.text
            nowhere = admin.patch(f"/admin/api/keys/{fleet.ids['solo']}", json={"team": "nope"})
            assert nowhere.status_code == 404
            assert "there is no team 'nope'" in error_of(nowhere)["message"]
            wrong = admin.post("/admin/api/keys", json={"name": "w", "team": 7})
            assert wrong.status_code == 400 and error_of(wrong)["param"] == "team"
            back = admin.patch(f"/admin/api/keys/{fleet.ids['solo']}", json={"team": None})
            assert back.json()["team"] is None
            listed = admin.get("/admin/api/teams").json()["teams"]
            assert {t["name"]: t["keys"] for t in listed} == {red: 2, blue: 2}

        # A member reads the team's usage but does not manage its keys.
        carl, csrf = _login(server, "carl")
        with contextlib.closing(carl):
            assert carl.get(f"/admin/api/teams/{red}/usage").status_code == 200
            assert carl.get(f"/admin/api/teams/{red}/keys").status_code == 403
            assert carl.post(f"/admin/api/teams/{red}/keys", json={"name": "c"},
                             headers=csrf).status_code == 403  # fmt: skip
    except BaseException:
        print(server.proc.output())
        raise
    finally:
        server.proc.stop()


def test_the_teams_cli_refuses_bad_input(tmp_path: Path) -> None:
    store = ["--data-dir", str(tmp_path / "data")]
    made("teams", "create", "ml", "--rpm", "5", *store)
    made("keys", "create", "--name", "k", "--team", "ml", *store)
    for args, message in (
        (("teams", "create", "ml"), "a team named 'ml' already exists"),
        (("teams", "create", "a b"), "team name 'a b' is not usable"),
        (("teams", "create", "team_x"), "not starting with 'team_'"),
        (("teams", "create", "z", "--rpm", "0"), "team rpm must be 1 or more"),
        (("teams", "create", "z", "--period", "week"), "--period 'week': use day or month"),
        (("teams", "create", "z", "--budget-tokens", "9"), "without a budget period"),
        (("teams", "create", "z", "--models", ","), "--models is empty"),
        (("teams", "show", "nope"), "there is no team 'nope'"),
        (("teams", "update", "ml"), "nothing to change"),
        (("teams", "update", "ml", "--rpm", "3", "--no-rpm"), "--rpm sets what --no-rpm clears"),
        (("teams", "remove", "ml"), "still has 1 active key(s) (k)"),
        (("teams", "members", "add", "ml", "nobody"), "there is no user 'nobody'"),
        (("teams", "members", "remove", "ml", "nobody"), "is not a member of team 'ml'"),
        (("keys", "create", "--name", "k2", "--team", "nope"), "there is no team 'nope'"),
        (("keys", "update", "k", "--team", "ml", "--no-team"), "--team sets what --no-team"),
        (("usage", "--by", "tribe"), "use hour, day, team, key, end-user or model"),
        (("usage", "--team", "nope"), "there is no team 'nope'"),
    ):
        result = cli(*args, *store)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
    made("users", "create", "dee", "--password-stdin", *store, stdin=PASSWORD + "\n")
    bad_role = cli("teams", "members", "add", "ml", "dee", "--role", "boss", *store)
    assert bad_role.returncode == 2
    assert "team role 'boss' is not one of team-admin, member" in bad_role.stderr
    # Nothing of it changed the team.
    shown = json.loads(made("teams", "show", "ml", "--json", *store))
    assert (shown["rpm"], shown["members"], shown["keys"]) == (5, [], 1)
    # Moved out of the team, the key no longer holds it back.
    made("keys", "update", "k", "--no-team", *store)
    made("teams", "remove", "ml", *store)
    assert json.loads(made("teams", "list", "--json", *store)) == []
