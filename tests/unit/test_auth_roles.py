"""The table of what each admin role may do (`llmgw.auth.roles`)."""

from __future__ import annotations

import pytest

from llmgw.auth import UserInputError, check_role, may, may_see, refusal, scope_role

FLEET_READS = ["/admin/api/nodes", "/admin/api/models/m", "/admin/", "/admin/nodes",
               "/admin/events", "/admin/api/leader", "/metrics"]  # fmt: skip
FLEET_CHANGES = [("POST", "/admin/api/nodes/n1/drain"), ("POST", "/admin/models/m/activate"),
                 ("PATCH", "/admin/api/models/m"), ("DELETE", "/admin/api/debug/memory/trace")]  # fmt: skip
KEYS_AND_USAGE = [("GET", "/admin/api/keys"), ("POST", "/admin/api/keys/k/rotate"),
                  ("GET", "/admin/api/usage/requests"), ("GET", "/admin/usage"),
                  ("GET", "/admin/usage.csv"), ("GET", "/admin/keys"),
                  ("POST", "/admin/keys/k/revoke")]  # fmt: skip
OPERATOR_READS = ["/debug/tasks", "/admin/api/debug/threads", "/admin/api/join-tokens"]


@pytest.mark.parametrize("path", FLEET_READS)
def test_every_role_reads_the_fleet(path: str) -> None:
    for role in ("admin", "operator", "viewer"):
        assert may(role, "GET", path) and may(role, "head", path)
    assert not may(None, "GET", path)


@pytest.mark.parametrize(("method", "path"), FLEET_CHANGES)
def test_operators_and_admins_change_the_fleet_viewers_do_not(method: str, path: str) -> None:
    assert may("admin", method, path) and may("operator", method, path)
    assert not may("viewer", method, path) and not may(None, method, path)


@pytest.mark.parametrize(("method", "path"), KEYS_AND_USAGE)
def test_only_admins_see_or_touch_keys_and_usage(method: str, path: str) -> None:
    assert may("admin", method, path)
    assert not may("operator", method, path) and not may("viewer", method, path)


@pytest.mark.parametrize("path", OPERATOR_READS)
def test_debug_and_join_tokens_are_not_for_viewers(path: str) -> None:
    assert may("operator", "GET", path) and may("admin", "GET", path)
    assert not may("viewer", "GET", path)


def test_a_placement_dry_run_is_a_read() -> None:
    assert may("viewer", "POST", "/admin/api/placement/dry-run")
    assert not may("viewer", "POST", "/admin/api/placement/dry-run/x")
    assert not may(None, "POST", "/admin/api/placement/dry-run")


def test_a_path_that_only_starts_like_a_guarded_one_is_not_guarded() -> None:
    # "/admin/keysmith" is not "/admin/keys"; it is an ordinary (unknown) read.
    assert may("viewer", "GET", "/admin/keysmith")
    assert not may("viewer", "GET", "/admin/keys/")


def test_sections_of_the_dashboard() -> None:
    assert [may_see(r, "keys") for r in ("admin", "operator", "viewer", None)] == [
        True, False, False, False,
    ]  # fmt: skip
    assert [may_see(r, "changes") for r in ("admin", "operator", "viewer", None)] == [
        True, True, False, False,
    ]  # fmt: skip
    assert may_see("viewer", "nodes") and not may_see(None, "nodes")


def test_roles_are_parsed_and_bad_ones_named() -> None:
    assert [check_role(v) for v in ("admin", "operator", "viewer", None, "", "none")] == [
        "admin", "operator", "viewer", None, None, None,
    ]  # fmt: skip
    for bad in ("Admin", "root", " viewer"):
        with pytest.raises(UserInputError, match="is not one of admin, operator, viewer"):
            check_role(bad)


def test_refusals_name_the_role_and_what_it_may_do() -> None:
    message = refusal("API key 'ci'", "viewer", "post", "/admin/api/nodes/n1/drain")
    assert message.startswith(
        "API key 'ci' has the role viewer, which may not POST /admin/api/nodes/n1/drain: "
        "viewers only read the fleet"
    )
    assert "no admin role" in refusal("user 'bob'", None, "GET", "/admin/")


def test_the_scope_role_defaults_to_admin_only_when_no_guard_set_one() -> None:
    assert scope_role({}) == "admin"
    assert scope_role({"llmgw.admin_role": "viewer"}) == "viewer"
    assert scope_role({"llmgw.admin_role": None}) is None
    assert scope_role({"llmgw.admin_role": "root"}) is None
