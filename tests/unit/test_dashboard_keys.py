"""Editing an API key on the dashboard's Keys page, over ASGI with a real store.

The sources are the server's own (`dashboard_sources(...)` with a real
`KeyService`), so an edit goes through the same validation as `llmgw keys
update` and lands in the store. Forms are sent the way a browser sends them:
every field of the edit form as it was served, with the person's changes.
The portal's CSRF check on an edit is tested in test_dashboard_portal.py.
"""

from __future__ import annotations

import dataclasses
import html
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
from dashboard_fleet import fleet_sources
from starlette.applications import Starlette

from llmgw.store import ApiKey, Store, open_store, store_url
from llmgw.web import DashboardSources, create_dashboard_routes

HX = {"HX-Request": "true"}
EXPIRY = datetime(2030, 1, 1, tzinfo=UTC)


@dataclass
class Dash:
    client: httpx.AsyncClient
    sources: DashboardSources
    store: Store


@pytest.fixture(name="dash")
async def dash_fixture(tmp_path: Path) -> AsyncIterator[Dash]:
    store = await open_store(store_url(tmp_path / "data", None))
    await store.upgrade()
    try:
        sources, _ = await fleet_sources(store, nodes=2, models=3)
        app = Starlette(routes=create_dashboard_routes(sources=sources))
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            yield Dash(client, sources, store)
    finally:
        await store.close()


class _FormFields(HTMLParser):
    """What a browser submits for a form: inputs (checked boxes only), selects."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: dict[str, str] = {}
        self._select: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        name = a.get("name")
        if tag == "input" and name and (a.get("type") != "checkbox" or "checked" in a):
            self.fields[name] = a.get("value") or ""
        elif tag == "select" and name:
            self._select = name
        elif tag == "option" and self._select:
            first = self._select not in self.fields
            # The first option, unless another one is selected.
            if first or "selected" in a:
                self.fields[self._select] = a.get("value") or ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None


def form_fields(fragment: str) -> dict[str, str]:
    parser = _FormFields()
    parser.feed(fragment)
    return parser.fields


def shown_fields(fields: dict[str, str]) -> dict[str, str]:
    """The visible fields, without the hidden copies of what the form was filled with."""
    return {k: v for k, v in fields.items() if not k.startswith("was_")}


def row(page: str, name: str) -> str:
    match = re.search(rf'<tr data-key="{re.escape(name)}".*?</tr>', page, re.DOTALL)
    assert match is not None, page
    return html.unescape(match.group(0))


async def team_key(dash: Dash, name: str = "team-a") -> ApiKey:
    key, _ = await dash.sources.keys.create(
        name=name,
        models=["model-001", "model-002"],
        rpm=60,
        tpm=5000,
        budget_tokens=1000,
        period="day",
        expires_at=EXPIRY,
        admin_role="admin",
    )
    return key


async def edit_form(dash: Dash, key: ApiKey) -> dict[str, str]:
    answer = await dash.client.get(f"/admin/keys/{key.id}/edit", headers=HX)
    assert answer.status_code == 200, answer.text
    return form_fields(answer.text)


async def save(dash: Dash, ref: str, fields: dict[str, str]) -> httpx.Response:
    return await dash.client.post(f"/admin/keys/{ref}/edit", data=fields, headers=HX)


async def stored(dash: Dash, key: ApiKey) -> ApiKey:
    (found,) = [k for k in await dash.store.keys.list(include_revoked=True) if k.id == key.id]
    return found


async def test_the_edit_form_is_filled_with_the_keys_current_values(dash: Dash) -> None:
    key = await team_key(dash)
    page = (await dash.client.get("/admin/keys")).text
    live = page[page.index('<section id="live"') :]
    # The Edit button is in the refreshing table; the form it opens is not.
    assert f'hx-get="/admin/keys/{key.id}/edit" hx-target="#key-edit"' in live
    assert '<div id="key-edit"></div>' in page and 'id="key-edit"' not in live

    answer = await dash.client.get(f"/admin/keys/{key.id}/edit", headers=HX)
    assert answer.status_code == 200
    assert "content-security-policy" in answer.headers
    assert f'hx-post="/admin/keys/{key.id}/edit" hx-target="#flash"' in answer.text
    fields = form_fields(answer.text)
    expected = {
        "name": "team-a",
        "models": "model-001, model-002",
        "rpm": "60",
        "tpm": "5000",
        "budget_tokens": "1000",
        "period": "day",
        "expires_at": "2030-01-01T00:00:00",
        "role": "admin",
        "user_rpm": "",
        "user_tpm": "",
        "user_budget_tokens": "",
    }
    assert shown_fields(fields) == expected
    copies = {k.removeprefix("was_"): v for k, v in fields.items() if k.startswith("was_")}
    assert copies == expected

    plain, _ = await dash.sources.keys.create(name="plain <b>")
    plain_fields = shown_fields(await edit_form(dash, plain))
    assert plain_fields == {"name": "plain <b>", "models": "", "rpm": "", "tpm": "",
                            "budget_tokens": "", "period": "", "expires_at": "",
                            "role": "", "user_rpm": "", "user_tpm": "",
                            "user_budget_tokens": ""}  # fmt: skip
    # Opened outside htmx (a link in a new tab): the Keys page instead.
    direct = await dash.client.get(f"/admin/keys/{key.id}/edit", follow_redirects=False)
    assert direct.status_code == 303 and direct.headers["location"] == "/admin/keys"


async def test_an_edit_lowers_rpm_and_restricts_models(dash: Dash) -> None:
    key = await team_key(dash)
    fields = await edit_form(dash, key)
    answer = await save(dash, key.id, {**fields, "rpm": "30", "models": "model-001"})
    assert answer.status_code == 200, answer.text
    assert "key team-a updated; routers apply it within a few seconds" in answer.text
    assert answer.headers["hx-trigger"] == "llmgw-refresh"

    after = await stored(dash, key)
    # Only those two changed: same secret, limits, expiry and admin flag.
    assert after == dataclasses.replace(
        key, rpm=30, models=("model-001",), updated_at=after.updated_at
    )
    assert after.updated_at > key.updated_at
    shown = row((await dash.client.get("/admin/keys", headers=HX)).text, "team-a")
    assert "30 req/min" in shown and "model-001" in shown and "model-002" not in shown

    # Saving the same form again changes nothing, and says so.
    again = await save(dash, key.id, {**fields, "rpm": "30", "models": "model-001"})
    assert again.status_code == 200 and 'class="notice ok"' in again.text
    assert "nothing to save: the form changes nothing in key team-a" in again.text
    assert await stored(dash, key) == after


async def test_end_user_limits_are_created_shown_edited_and_cleared(dash: Dash) -> None:
    created = await dash.client.post(
        "/admin/keys",
        data={"name": "app", "user_rpm": "20", "user_budget_tokens": "5000"},
        headers=HX,
    )
    assert created.status_code == 200, created.text
    (key,) = [k for k in await dash.store.keys.list() if k.name == "app"]
    assert (key.user_rpm, key.user_tpm, key.user_budget_tokens) == (20, None, 5000)
    shown = row((await dash.client.get("/admin/keys", headers=HX)).text, "app")
    assert "each end user: 20 req/min 5,000 tok/day" in shown

    fields = await edit_form(dash, key)
    assert (fields["user_rpm"], fields["user_tpm"], fields["user_budget_tokens"]) == (
        "20", "", "5000",
    )  # fmt: skip
    answer = await save(dash, key.id, {**fields, "user_tpm": "900", "user_rpm": ""})
    assert answer.status_code == 200, answer.text
    after = await stored(dash, key)
    assert (after.user_rpm, after.user_tpm, after.user_budget_tokens) == (None, 900, 5000)
    # The key's own limits were not touched.
    assert (after.rpm, after.tpm, after.budget_tokens) == (key.rpm, key.tpm, key.budget_tokens)

    bad = await save(dash, key.id, {**fields, "user_tpm": "lots"})
    assert "user_tpm must be a whole number" in bad.text
    assert await stored(dash, key) == after


async def test_emptying_a_field_clears_that_limit(dash: Dash) -> None:
    key = await team_key(dash)
    fields = await edit_form(dash, key)
    fields["role"] = ""  # "none (a client key)"
    fields.update(models="", rpm="", budget_tokens="", expires_at="")  # the period is left
    answer = await save(dash, key.id, fields)
    assert answer.status_code == 200, answer.text

    after = await stored(dash, key)
    assert (after.models, after.rpm, after.tpm) == (None, None, 5000)
    # Clearing the budget clears its period with it.
    assert (after.budget_tokens, after.budget_period) == (None, None)
    assert (after.expires_at, after.admin_role) == (None, None)
    shown = row((await dash.client.get("/admin/keys", headers=HX)).text, "team-a")
    assert "all" in shown and "5,000 tok/min" in shown and "req/min" not in shown
    assert shown_fields(await edit_form(dash, key)) == {
        "name": "team-a", "models": "", "rpm": "", "tpm": "5000",
        "budget_tokens": "", "period": "", "expires_at": "", "role": "",
        "user_rpm": "", "user_tpm": "", "user_budget_tokens": "",
    }  # fmt: skip


async def test_a_bad_value_names_the_field_and_changes_nothing(dash: Dash) -> None:
    key, _ = await dash.sources.keys.create(name="plain", rpm=10)
    await dash.sources.keys.create(name="taken")
    fields = await edit_form(dash, key)
    cases = {
        (("rpm", "-5"),): (400, "rpm must be at least 1 (clear it for no limit), got -5"),
        (("rpm", "lots"),): (400, "rpm must be a whole number, got 'lots'"),
        (("budget_tokens", "500"),): (400, "budget_tokens needs period day|month"),
        (("period", "month"),): (400, "period only applies with budget_tokens"),
        (("budget_tokens", "5"), ("period", "week")): (400, "period must be day or month"),
        (("expires_at", "2001-01-01T00:00"),): (400, "expires_at is in the past"),
        (("expires_at", "soon"),): (400, "expires_at is not a date and time"),
        (("name", " "),): (400, "name must be 1 to 200 characters"),
        (("name", "taken"),): (409, "taken"),
    }
    before = await dash.store.keys.list(include_revoked=True)
    for changes, (status, text) in cases.items():
        answer = await save(dash, key.id, {**fields, **dict(changes)})
        assert answer.status_code == status, (changes, answer.text)
        assert text in html.unescape(answer.text), (changes, answer.text)
        assert 'class="notice error"' in answer.text and "hx-trigger" not in answer.headers
    assert await dash.store.keys.list(include_revoked=True) == before


async def test_an_old_form_does_not_undo_a_change_made_elsewhere(dash: Dash) -> None:
    key = await team_key(dash)
    fields = await edit_form(dash, key)
    # While the form is open, someone lowers the rpm with `llmgw keys update`.
    await dash.sources.keys.update(key.id, rpm=5)
    answer = await save(dash, key.id, {**fields, "tpm": "700"})
    assert answer.status_code == 200, answer.text
    after = await stored(dash, key)
    assert (after.rpm, after.tpm) == (5, 700)

    # A form without the copies of what it showed is compared with the key as it is.
    whole = shown_fields(fields)
    assert (await save(dash, key.id, whole)).status_code == 200
    after = await stored(dash, key)
    assert (after.rpm, after.tpm) == (60, 5000)


async def test_a_revoked_or_unknown_key_cannot_be_edited(dash: Dash) -> None:
    key = await team_key(dash)
    fields = await edit_form(dash, key)
    await dash.sources.keys.revoke(key.id)
    revoked = await stored(dash, key)

    answer = await save(dash, key.id, {**fields, "rpm": "1"})
    assert answer.status_code == 409
    assert "is revoked and cannot be changed; create a new key instead" in answer.text
    assert await stored(dash, key) == revoked
    unchanged = await save(dash, key.id, fields)  # nothing changed: still refused
    assert unchanged.status_code == 409 and "is revoked" in unchanged.text

    form = await dash.client.get(f"/admin/keys/{key.id}/edit", headers=HX)
    assert form.status_code == 409 and "key team-a is revoked" in form.text
    everything = (await dash.client.get("/admin/keys?all=1", headers=HX)).text
    assert f"/admin/keys/{key.id}/edit" not in everything  # no Edit button on its row

    for method in ("get", "post"):
        unknown = await dash.client.request(method, "/admin/keys/no-such-key/edit", headers=HX)
        assert unknown.status_code == 404
        assert "no key has the id, name or prefix" in unknown.text


async def test_an_edit_needs_the_htmx_header(dash: Dash) -> None:
    key = await team_key(dash)
    fields = await edit_form(dash, key)
    answer = await dash.client.post(f"/admin/keys/{key.id}/edit", data={**fields, "rpm": "1"})
    assert answer.status_code == 403 and "HX-Request: true" in answer.text
    assert await stored(dash, key) == key
