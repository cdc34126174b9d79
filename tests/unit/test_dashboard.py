"""The dashboard's pages and actions over ASGI, with the real control-plane objects.

A real `Inventory`, `Catalog` (its writes in a real SQLite store), `Controller`
(never run) and `ModelControlService`, a real `KeyService` and usage repository,
adapted by the same `dashboard_sources(...)` the server uses: so every page is
rendered from the dicts the admin API returns. The admin listener's case is
tested here (no portal); the portal's in test_dashboard_portal.py.
"""

from __future__ import annotations

import csv
import dataclasses
import html
import io
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from dashboard_fleet import FAILED_TAIL, DashboardFleet, fleet_sources
from starlette.applications import Starlette

from llmgw.control.catalog import parse_model
from llmgw.control.inventory.model import GpuInfo, NodeRegistration, ShardReport, ShardSpec
from llmgw.store import Store, UsageRecord, open_store, store_url
from llmgw.web import ActionError, DashboardSources, create_dashboard_routes

HX = {"HX-Request": "true"}
PAGES = (
    "/admin/",
    "/admin/nodes",
    "/admin/models",
    "/admin/models/model-001",
    "/admin/usage",
    "/admin/keys",
    "/admin/events",
)
EVIL = "<img src=x onerror=alert(1)>"


@dataclass
class Dash:
    client: httpx.AsyncClient
    sources: DashboardSources
    fleet: DashboardFleet
    store: Store


def client_for(sources: DashboardSources, **settings: Any) -> httpx.AsyncClient:
    app = Starlette(routes=create_dashboard_routes(sources=sources, **settings))
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://admin")


@pytest.fixture(name="dash")
async def dash_fixture(tmp_path: Path) -> AsyncIterator[Dash]:
    store = await open_store(store_url(tmp_path / "data", None))
    await store.upgrade()
    try:
        sources, fleet = await fleet_sources(store, nodes=6, models=20)
        async with client_for(sources) as client:
            yield Dash(client, sources, fleet, store)
    finally:
        await store.close()


def register_node(
    fleet: DashboardFleet,
    node_id: str,
    *,
    labels: dict[str, str] | None = None,
    shards: tuple[ShardReport, ...] = (),
) -> None:
    fleet.inventory.register(
        NodeRegistration(
            node_id=node_id,
            hostname=f"{node_id}.example",
            agent_version="0.1.0",
            gpus=(GpuInfo(0, "GPU-x-0", "NVIDIA L4", 24 << 30, 23 << 30),),
            labels=labels or {},
            fabric={"ib-domain": "pod9"},
            running_shards=shards,
            port_range=(30000, 30010),
        )
    )


def failed_shard(model: str, tail: tuple[str, ...] = FAILED_TAIL) -> ShardReport:
    spec = ShardSpec(shard_id=f"{model}-bad", model=model, engine="sim", weights="none")
    return ShardReport(
        shard_id=f"{model}-bad",
        model=model,
        state="failed",
        message="the engine exited with status 2 before it was ready",
        output_tail=tail,
        exit_code=2,
        spec=spec,
    )


def live_part(page: str) -> str:
    start = page.index('<section id="live"')
    return page[start : page.index("</section>", start)]


def shown(answer: httpx.Response) -> str:
    """The answer's text as a browser shows it (entities decoded)."""
    return html.unescape(answer.text)


# ---- pages ----


async def test_every_page_renders_whole_and_as_its_refreshing_fragment(dash: Dash) -> None:
    for path in PAGES:
        full = await dash.client.get(path)
        assert full.status_code == 200, (path, full.text[:500])
        assert full.headers["content-type"].startswith("text/html")
        assert full.text.startswith("<!doctype html>")
        assert '<meta name="viewport"' in full.text
        assert 'href="/admin/nodes"' in full.text  # the navigation
        assert 'hx-trigger="every 5000ms, llmgw-refresh from:body"' in full.text
        assert "no-store" in full.headers["cache-control"]
        assert "HX-Request" in full.headers["vary"]

        fragment = await dash.client.get(path, headers=HX)
        assert fragment.status_code == 200
        assert fragment.text.lstrip().startswith('<section id="live"'), path
        assert "<html" not in fragment.text and "<nav" not in fragment.text
        # The fragment is the live part of the page, and refreshes from the same URL.
        assert f'hx-get="{path}"' in fragment.text
        assert live_part(fragment.text) == live_part(full.text)


async def test_pages_show_the_fleet_as_the_admin_api_describes_it(dash: Dash) -> None:
    nodes = dash.sources.nodes()
    listing = dash.sources.models()
    overview = (await dash.client.get("/admin/")).text
    gpus = sum(len(n["gpus"]) for n in nodes)
    in_use = sum(1 for n in nodes for g in n["gpus"] if g["in_use"])
    assert f"{in_use} <span" in overview and f"/ {gpus}</span>" in overview
    assert f"ready {len(nodes)}" in overview
    assert "ctl-1:4242" in overview and "leader" in overview
    # Every server on the store, the leader first, each with its role.
    servers = overview.split("Servers on this store")[1].split("</ul>")[0]
    rows = [re.sub(r"<[^>]+>", "", li).split() for li in servers.split("<li>")[1:]]
    assert [r[:3] for r in rows] == [
        ["ctl-1:4242", "leader", "this"],
        ["ctl-2:4343", "standby", "v0.1.0,"],
    ]
    assert "Requests / s" in overview and "<polyline" in overview

    page = (await dash.client.get("/admin/nodes")).text
    for node in nodes:
        assert f'data-node="{node["id"]}"' in page
        assert node["hostname"] in page
    assert "zone=a" in page and "ib-domain=pod0" in page
    draining = [n["id"] for n in nodes if n["draining"]]
    for node_id in draining:
        assert f'/admin/nodes/{node_id}/undrain"' in page

    page = (await dash.client.get("/admin/models")).text
    for model in listing["models"]:
        assert f'data-model="{model["name"]}"' in page
    assert "tp1" in page


async def test_the_refresh_interval_comes_from_the_setting(dash: Dash) -> None:
    async with client_for(dash.sources, refresh_seconds=2.5) as client:
        page = await client.get("/admin/nodes")
    assert 'hx-trigger="every 2500ms, llmgw-refresh from:body"' in page.text
    with pytest.raises(ValueError, match="positive"):
        create_dashboard_routes(sources=dash.sources, refresh_seconds=0)


async def test_a_failed_model_shows_its_reason_and_the_engine_output(dash: Dash) -> None:
    register_node(dash.fleet, "node-bad", shards=(failed_shard("model-002"),))
    page = await dash.client.get("/admin/models/model-002")
    assert page.status_code == 200
    assert "the engine exited with status 2 before it was ready" in page.text
    assert "usage: sim [-h] [--model MODEL] ..." in page.text
    # The engine's output is the engine's: shown as text, never as markup.
    assert "<script>alert(1)</script>" not in page.text
    assert "--no-such-flag &lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    overview = (await dash.client.get("/admin/")).text
    assert "model-002" in live_part(overview).split("Needs attention")[1]


async def test_a_model_page_shows_its_load_targets_and_signals(dash: Dash) -> None:
    base = dash.fleet.catalog.get("model-001")
    assert base is not None
    await dash.fleet.catalog.add(
        dataclasses.replace(
            base, name="scaled", aliases=(), target_queue_depth=4, target_kv_use=0.8
        )
    )
    page = await dash.client.get("/admin/models/scaled")
    assert page.status_code == 200
    assert "one replica per 4 requests waiting or per 80% KV-cache use, down after" in page.text
    assert "0 waiting (not reported in engines, 0 in routers)" in page.text
    assert "KV cache not reported" in page.text
    await dash.fleet.catalog.add(
        dataclasses.replace(
            base, name="waits", aliases=(), target_in_flight=8, target_queue_wait=1.5
        )
    )
    page = await dash.client.get("/admin/models/waits")
    assert page.status_code == 200
    assert (
        "one replica per 8 requests in flight, or one more than are Ready while requests "
        "wait over 1.5 s in the routers&#39; queues, down after"
    ) in page.text
    assert "0 in routers) · longest wait 0.0 s ·" in page.text


async def test_a_model_page_shows_its_sleep_after(dash: Dash) -> None:
    base = dash.fleet.catalog.get("model-001")
    assert base is not None
    await dash.fleet.catalog.add(
        dataclasses.replace(base, name="napper", aliases=(), sleep_after=120.0)
    )
    page = await dash.client.get("/admin/models/napper")
    assert page.status_code == 200
    assert '<dt>sleep after</dt><dd id="sleep-after">' in page.text
    assert "sleep after" not in (await dash.client.get("/admin/models/model-001")).text


async def test_a_model_page_shows_a_profiles_adapter_slots(dash: Dash) -> None:
    await dash.fleet.catalog.add(
        parse_model(
            {
                "name": "tuned",
                "weights": "none",
                "profiles": [
                    {"name": "sim", "engine": "sim", "adapters": {"max_loaded": 4, "max_rank": 8}}
                ],
            }
        )
    )
    page = await dash.client.get("/admin/models/tuned")
    assert page.status_code == 200
    assert "up to 4 LoRA adapters loaded at once (rank ≤ 8)" in page.text
    assert 'id="adapters"' not in page.text
    await dash.fleet.catalog.add(
        parse_model({"name": "tuned-sql", "adapter_of": "tuned", "weights": "/srv/sql"})
    )
    page = await dash.client.get("/admin/models/tuned")
    card = page.text.split('id="adapters"', 1)[1]
    assert "<strong>tuned-sql</strong>" in card and "/srv/sql" in card
    listing = await dash.client.get("/admin/models")
    row = listing.text.split('data-model="tuned"', 1)[1].split("</tr>", 1)[0]
    assert "LoRA adapters: tuned-sql" in row
    # Listed under its base, not as a model with replicas of its own.
    assert 'data-model="tuned-sql"' not in listing.text


async def test_a_model_that_fits_nowhere_explains_why_node_by_node(dash: Dash) -> None:
    page = await dash.client.get("/admin/models/model-016")  # wants a B200; none exists
    assert page.status_code == 200
    assert "Cannot be placed now." in page.text
    assert "no GPU matches kind &#39;B200&#39;" in page.text
    assert "node-000" in page.text and "profile tp" in page.text


async def test_an_unknown_model_page_is_a_404_that_says_so(dash: Dash) -> None:
    page = await dash.client.get("/admin/models/no-such-model")
    assert page.status_code == 404
    assert "No model named <strong>no-such-model</strong>" in page.text
    fragment = await dash.client.get("/admin/models/no-such-model", headers=HX)
    assert fragment.status_code == 404 and "<html" not in fragment.text


async def test_models_are_found_by_alias_and_names_with_slashes_route(dash: Dash) -> None:
    by_alias = await dash.client.get("/admin/models/m7")
    assert by_alias.status_code == 200 and "Model model-007" in by_alias.text
    spec = "name: org/llama\nweights: none\nprofiles: [{name: cpu, engine: sim}]\n"
    added = await dash.client.post("/admin/models", data={"spec": spec}, headers=HX)
    assert added.status_code == 200, added.text
    page = await dash.client.get("/admin/models/org/llama")
    assert page.status_code == 200 and "Model org/llama" in page.text
    assert 'hx-post="/admin/models/org/llama/edit"' in page.text
    edited = await dash.client.post(
        "/admin/models/org/llama/edit", data={"spec": spec + "max_replicas: 3\n"}, headers=HX
    )
    assert edited.status_code == 200, edited.text
    model = dash.fleet.catalog.get("org/llama")
    assert model is not None and model.max_replicas == 3


async def test_events_newest_first_and_filtered(dash: Dash) -> None:
    events = [
        {"at": "2026-01-01T12:00:05+00:00", "kind": "ready", "model": "model-001",
         "node": "node-001", "message": "replica r1 is ready at http://10.0.0.1:20000"},
        {"at": "2026-01-01T12:00:03+00:00", "kind": "node", "model": "",
         "node": "node-007", "message": "lost: no heartbeats"},
        {"at": "2026-01-01T12:00:01+00:00", "kind": "start", "model": "model-003",
         "node": "node-002", "message": f"start replica r2 {EVIL}"},
    ]  # fmt: skip
    sources = dataclasses.replace(dash.sources, events=lambda: events)
    async with client_for(sources) as client:
        page = (await client.get("/admin/events")).text
        assert page.index("replica r1 is ready") < page.index("start replica r2")
        assert EVIL not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
        assert "lost: no heartbeats" in page and 'href="/admin/models/"' not in page
        only = (await client.get("/admin/events?model=model-003")).text
        assert "start replica r2" in only and "replica r1 is ready" not in only
        kind = (await client.get("/admin/events?kind=ready", headers=HX)).text
        assert "replica r1 is ready" in kind and "start replica r2" not in kind


# ---- actions ----


async def test_drain_and_undrain_a_node_from_the_page(dash: Dash) -> None:
    node_id = next(n["id"] for n in dash.sources.nodes() if not n["draining"])
    answer = await dash.client.post(f"/admin/nodes/{node_id}/drain", headers=HX)
    assert answer.status_code == 200
    assert f"node {node_id} is draining" in answer.text
    assert answer.headers["hx-trigger"] == "llmgw-refresh"
    assert dash.fleet.inventory.node(node_id).draining
    page = (await dash.client.get("/admin/nodes", headers=HX)).text
    assert f'/admin/nodes/{node_id}/undrain"' in page

    answer = await dash.client.post(f"/admin/nodes/{node_id}/undrain", headers=HX)
    assert answer.status_code == 200 and "takes new replicas again" in answer.text
    assert not dash.fleet.inventory.node(node_id).draining

    missing = await dash.client.post("/admin/nodes/nobody/drain", headers=HX)
    assert missing.status_code == 404
    assert "no node 'nobody' is known" in shown(missing)
    assert 'role="alert"' in missing.text and "hx-trigger" not in missing.headers


async def test_changes_need_the_htmx_header(dash: Dash) -> None:
    """On the admin listener there is no session: only a same-origin page can set
    HX-Request, so a cross-site form post is refused and changes nothing."""
    node_id = dash.sources.nodes()[0]["id"]
    was_draining = dash.fleet.inventory.node(node_id).draining
    attempts = {
        f"/admin/nodes/{node_id}/drain": {},
        "/admin/models": {"spec": "name: x\nweights: none\nprofiles: [{engine: sim}]"},
        "/admin/models/model-001/remove": {},
        "/admin/models/model-001/activate": {},
        "/admin/keys": {"name": "sneaky"},
    }
    for path, form in attempts.items():
        answer = await dash.client.post(path, data=form)
        assert answer.status_code == 403, path
        assert "HX-Request: true" in answer.text
    assert dash.fleet.inventory.node(node_id).draining == was_draining
    assert dash.fleet.catalog.get("x") is None
    assert await dash.store.keys.list() == []


async def test_add_a_model_and_see_why_a_bad_one_is_refused(dash: Dash) -> None:
    async def add(spec: str) -> httpx.Response:
        return await dash.client.post("/admin/models", data={"spec": spec}, headers=HX)

    good = await add(
        '{"name": "fresh", "weights": "none", "profiles": [{"name": "cpu", "engine": "sim"}]}'
    )
    assert good.status_code == 200, good.text
    assert "model fresh added" in good.text and 'href="/admin/models/fresh"' in good.text
    model = dash.fleet.catalog.get("fresh")
    assert model is not None and model.source == "store"
    assert 'data-model="fresh"' in (await dash.client.get("/admin/models")).text

    cases = {
        "name: broken\nweights: none\nprofiles: []\n": (400, "profiles"),
        "name: fresh\nweights: none\nprofiles: [{engine: sim}]\n": (409, "fresh"),
        "name: [unclosed\n": (400, "not valid YAML or JSON"),
        "- a\n- b\n": (400, "must be a mapping"),
        "": (400, "the model is empty"),
        "base: &b {engine: sim}\nname: y\nweights: none\nprofiles: [*b]\n": (400, "aliases"),
    }
    for spec, (status, text) in cases.items():
        answer = await add(spec)
        assert answer.status_code == status, (spec, answer.text)
        assert text in answer.text, (spec, answer.text)
        assert 'class="notice error"' in answer.text
    assert dash.fleet.catalog.get("broken") is None


async def test_edit_and_remove_a_stored_model_but_not_a_config_one(dash: Dash) -> None:
    spec = "name: mine\nweights: none\nprofiles: [{name: cpu, engine: sim}]\n"
    assert (await dash.client.post("/admin/models", data={"spec": spec}, headers=HX)).is_success
    page = (await dash.client.get("/admin/models/mine")).text
    assert 'hx-post="/admin/models/mine/edit"' in page and "name: mine" in page

    renamed = await dash.client.post(
        "/admin/models/mine/edit", data={"spec": spec.replace("mine", "theirs")}, headers=HX
    )
    assert renamed.status_code == 400 and "cannot be renamed" in renamed.text

    removed = await dash.client.post("/admin/models/mine/remove", headers=HX)
    assert removed.status_code == 200 and "model mine removed" in removed.text
    assert dash.fleet.catalog.get("mine") is None
    gone = await dash.client.post("/admin/models/mine/remove", headers=HX)
    assert gone.status_code == 404 and "not in the catalog" in gone.text

    config = (await dash.client.get("/admin/models/model-001")).text
    assert "/admin/models/model-001/edit" not in config  # no form for a config model
    refused = await dash.client.post("/admin/models/model-001/remove", headers=HX)
    assert refused.status_code == 409 and "config" in refused.text
    assert dash.fleet.catalog.get("model-001") is not None


async def test_activate_now_reports_the_outcome(dash: Dash) -> None:
    calls: list[str] = []

    async def activate(name: str) -> dict[str, Any]:
        calls.append(name)
        if name == "model-016":
            return {"state": "unplaceable", "ready_replicas": 0,
                    "error": {"message": "no node has a B200", "code": "unplaceable"}}  # fmt: skip
        if name == "ghost":
            raise ActionError("model 'ghost' is not in the catalog", status=404)
        return {"state": "ready", "ready_replicas": 1, "error": None}

    sources = dataclasses.replace(dash.sources, activate=activate)
    async with client_for(sources) as client:
        ok = await client.post("/admin/models/model-001/activate", headers=HX)
        assert ok.status_code == 200 and "model model-001 is ready (1 ready)" in ok.text
        refused = await client.post("/admin/models/model-016/activate", headers=HX)
        assert refused.status_code == 409 and "no node has a B200" in refused.text
        missing = await client.post("/admin/models/ghost/activate", headers=HX)
        assert missing.status_code == 404 and "not in the catalog" in missing.text
    assert calls == ["model-001", "model-016", "ghost"]


async def test_the_real_activate_adapter_refuses_an_unknown_model(dash: Dash) -> None:
    answer = await dash.client.post("/admin/models/ghost/activate", headers=HX)
    assert answer.status_code == 404 and "not in the catalog" in answer.text


async def test_create_revoke_and_rotate_keys(dash: Dash) -> None:
    created = await dash.client.post(
        "/admin/keys",
        data={"name": "team-a", "models": "model-001, model-002", "rpm": "60", "tpm": "",
              "budget_tokens": "1000", "period": "day", "expires_at": "2030-01-01T00:00"},
        headers=HX,
    )  # fmt: skip
    assert created.status_code == 200, created.text
    secret = re.search(r'id="new-secret">([^<]+)<', created.text)
    assert secret is not None and secret.group(1).startswith("sk-")
    assert "shown once" in created.text
    (key,) = await dash.store.keys.list()
    assert (key.name, key.models, key.rpm, key.tpm) == ("team-a", ("model-001", "model-002"), 60, None)  # fmt: skip
    assert (key.budget_tokens, key.budget_period) == (1000, "day")
    assert key.expires_at is not None and key.expires_at.year == 2030

    page = (await dash.client.get("/admin/keys")).text
    assert 'data-key="team-a"' in page and "60 req/min" in page and "1,000 tok/day" in page
    assert secret.group(1) not in page  # never shown again

    rotated = await dash.client.post(f"/admin/keys/{key.id}/rotate", headers=HX)
    new_secret = re.search(r'id="new-secret">([^<]+)<', rotated.text)
    assert rotated.status_code == 200 and new_secret is not None
    assert new_secret.group(1) != secret.group(1)

    revoked = await dash.client.post(f"/admin/keys/{key.id}/revoke", headers=HX)
    assert revoked.status_code == 200 and "key team-a revoked" in revoked.text
    assert (await dash.store.keys.list(include_revoked=True))[0].revoked
    assert 'data-key="team-a"' not in (await dash.client.get("/admin/keys")).text
    everything = (await dash.client.get("/admin/keys?all=1")).text
    assert 'data-key="team-a"' in everything and "revoked" in everything


async def test_bad_key_forms_say_what_is_wrong(dash: Dash) -> None:
    cases = {
        (("name", ""),): (400, "name"),
        (("name", "x"), ("rpm", "0")): (400, "rpm"),
        (("name", "x"), ("rpm", "many")): (400, "whole number"),
        (("name", "x"), ("budget_tokens", "5")): (400, "period"),
        (("name", "x"), ("expires_at", "2001-01-01T00:00")): (400, "past"),
        (("name", "x"), ("expires_at", "soon")): (400, "not a date"),
    }
    for fields, (status, text) in cases.items():
        answer = await dash.client.post("/admin/keys", data=dict(fields), headers=HX)
        assert answer.status_code == status, (fields, answer.text)
        assert text in answer.text, (fields, answer.text)
    assert await dash.store.keys.list() == []
    await dash.client.post("/admin/keys", data={"name": "dup"}, headers=HX)
    again = await dash.client.post("/admin/keys", data={"name": "dup"}, headers=HX)
    assert again.status_code == 409
    unknown = await dash.client.post("/admin/keys/no-such-key/revoke", headers=HX)
    assert unknown.status_code == 404 and "no key has the id" in unknown.text


# ---- usage ----


async def record_usage(dash: Dash, key_id: str | None, model: str, tokens: int, hours_ago: float) -> None:  # fmt: skip
    await dash.store.usage.record_batch(
        [
            UsageRecord(
                ts=dash.fleet.clock.now - timedelta(hours=hours_ago),
                request_id=f"r-{model}-{hours_ago}-{tokens}",
                key_id=key_id,
                model=model,
                endpoint="e",
                status=200,
                prompt_tokens=tokens,
                completion_tokens=10,
                latency_ms=120.0,
                ttft_ms=None,
                streamed=False,
            )
        ]
    )


async def test_usage_by_key_and_model_over_a_range(dash: Dash) -> None:
    await dash.client.post("/admin/keys", data={"name": "team-a"}, headers=HX)
    await dash.client.post("/admin/keys", data={"name": "=HYPERLINK(1)"}, headers=HX)
    keys = {k.name: k.id for k in await dash.store.keys.list()}
    await record_usage(dash, keys["team-a"], "model-001", 500, hours_ago=2)
    await record_usage(dash, keys["team-a"], "model-002", 300, hours_ago=30)
    await record_usage(dash, keys["=HYPERLINK(1)"], "model-001", 90, hours_ago=3)
    await record_usage(dash, None, "model-003", 7, hours_ago=1)

    day = await dash.client.get("/admin/usage?range=24h")
    assert day.status_code == 200
    by_key = day.text.split("<h2>By key</h2>")[1].split("<h2>By model</h2>")[0]
    assert "team-a" in by_key and "510" in by_key  # 500 prompt + 10 completion
    assert "(no key)" in by_key and "=HYPERLINK(1)" in by_key
    assert "model-002" not in day.text.split("<h2>By model</h2>")[1]
    assert "Tokens / hour" in day.text

    week = (await dash.client.get("/admin/usage?range=7d", headers=HX)).text
    assert "model-002" in week.split("<h2>By model</h2>")[1]
    assert "Tokens / hour" in week
    # Beyond a week the charts are per day: 30 points, not 720.
    month = (await dash.client.get("/admin/usage?range=30d", headers=HX)).text
    assert "Tokens / day" in month and "Requests / day" in month
    assert "Tokens / hour" not in month
    assert "model-002" in month.split("<h2>By model</h2>")[1]
    custom = await dash.client.get(
        "/admin/usage", params={"since": "2025-12-31T05:00", "until": "2026-01-01T12:00"}
    )
    assert custom.status_code == 200 and "model-002" in custom.text

    for params, text in (
        ({"range": "1y"}, "'range' takes"),
        ({"since": "yesterday"}, "not a date and time"),
        ({"since": "2026-01-02T00:00", "until": "2026-01-01T00:00"}, "must be before"),
    ):
        bad = await dash.client.get("/admin/usage", params=params)
        assert bad.status_code == 400 and text in shown(bad)


async def test_usage_csv_export(dash: Dash) -> None:
    await dash.client.post("/admin/keys", data={"name": "=HYPERLINK(1)"}, headers=HX)
    (key,) = await dash.store.keys.list()
    await record_usage(dash, key.id, "model-001", 90, hours_ago=3)
    await record_usage(dash, key.id, "model-001", 10, hours_ago=2)
    await record_usage(dash, None, "model-003", 7, hours_ago=1)

    answer = await dash.client.get("/admin/usage.csv?range=24h")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "text/csv; charset=utf-8"
    assert answer.headers["content-disposition"].startswith('attachment; filename="llmgw-usage-')
    rows = list(csv.reader(io.StringIO(answer.text)))
    assert rows[0] == ["key_id", "key_name", "model", "requests", "errors", "prompt_tokens",
                       "completion_tokens", "total_tokens", "mean_latency_ms"]  # fmt: skip
    body = {(r[1], r[2]): r for r in rows[1:]}
    # A cell a spreadsheet would run as a formula is kept as text.
    assert body[("'=HYPERLINK(1)", "model-001")][3:8] == ["2", "0", "100", "20", "120"]
    assert body[("", "model-003")][0] == ""  # the requests made without a key

    hourly = await dash.client.get("/admin/usage.csv?range=24h&by=hour,model")
    header, *lines = list(csv.reader(io.StringIO(hourly.text)))
    assert header[:2] == ["hour", "model"] and len(lines) == 3
    daily = await dash.client.get("/admin/usage.csv?range=24h&by=day,model")
    header, *lines = list(csv.reader(io.StringIO(daily.text)))
    assert header[:2] == ["day", "model"]
    # Three hours ago to an hour ago: the same day or two, whole dates.
    assert all(len(line[0]) == 10 and line[0].count("-") == 2 for line in lines)
    assert sum(int(line[2]) for line in lines) == 3
    both = await dash.client.get("/admin/usage.csv?by=hour,day")
    assert both.status_code == 400 and "hour or day, not both" in both.text
    bad = await dash.client.get("/admin/usage.csv?by=colour")
    assert bad.status_code == 400 and "'by' takes" in bad.text


# ---- static files, escaping, headers ----


async def test_static_files_come_from_the_package_with_long_cache_headers(dash: Dash) -> None:
    page = (await dash.client.get("/admin/")).text
    urls = re.findall(r'(?:href|src)="(/admin/static/[^"]+)"', page)
    assert len(urls) == 3 and all("?v=" in u for u in urls)
    types = {}
    for url in urls:
        answer = await dash.client.get(url)
        assert answer.status_code == 200
        assert answer.headers["cache-control"] == "public, max-age=31536000, immutable"
        assert answer.headers["x-content-type-options"] == "nosniff"
        types[url.split("?")[0]] = answer.headers["content-type"]
        again = await dash.client.get(url, headers={"If-None-Match": answer.headers["etag"]})
        assert again.status_code == 304 and not again.content
    assert types == {
        "/admin/static/dashboard.css": "text/css; charset=utf-8",
        "/admin/static/htmx.min.js": "text/javascript; charset=utf-8",
        "/admin/static/dashboard.js": "text/javascript; charset=utf-8",
    }
    htmx = await dash.client.get("/admin/static/htmx.min.js")
    assert htmx.text.startswith("var htmx=function()")
    for path in ("/admin/static/portal.py", "/admin/static/htmx.LICENSE", "/admin/static/..%2Fportal.py"):  # fmt: skip
        assert (await dash.client.get(path)).status_code == 404, path
    # Nothing on any page is fetched from another host.
    for path in PAGES:
        text = (await dash.client.get(path)).text
        assert not re.search(r'(?:src|href)="(?:https?:)?//', text), path


async def test_pages_have_no_inline_script_or_style_for_the_csp(dash: Dash) -> None:
    register_node(dash.fleet, "node-bad", shards=(failed_shard("model-002"),))
    for path in (*PAGES, "/admin/models/model-002", "/admin/models/model-016"):
        answer = await dash.client.get(path)
        csp = answer.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "style-src 'self'" in csp
        assert "frame-ancestors 'none'" in csp
        assert answer.headers["x-frame-options"] == "DENY"
        assert " style=" not in answer.text and "<style" not in answer.text, path
        assert re.findall(r"<script(?![^>]*\ssrc=)", answer.text) == [], path
        assert re.findall(r"<[^>]*\son[a-z]+=", answer.text) == [], path


async def test_user_controlled_text_is_escaped(dash: Dash) -> None:
    register_node(
        dash.fleet,
        "node-evil",
        labels={"team": EVIL},
        shards=(failed_shard("model-004", tail=(f"Traceback: {EVIL}",)),),
    )
    await dash.client.post("/admin/keys", data={"name": f"key {EVIL}"}, headers=HX)
    spec = f"name: odd\nweights: '{EVIL}'\nprofiles: [{{engine: sim, engine_args: ['{EVIL}']}}]\n"
    added = await dash.client.post("/admin/models", data={"spec": spec}, headers=HX)
    assert added.status_code == 200, added.text
    # Names are checked by the catalog; its message quotes what was typed, escaped.
    refused = await dash.client.post(
        "/admin/models", data={"spec": f"name: '{EVIL}'\nweights: none"}, headers=HX
    )
    assert refused.status_code == 400 and EVIL not in refused.text
    assert "is not a model name" in shown(refused) and EVIL in shown(refused)
    for path in ("/admin/nodes", "/admin/models/model-004", "/admin/keys", "/admin/models/odd"):
        text = (await dash.client.get(path)).text
        assert EVIL not in text, path
        assert "&lt;img src=x onerror=alert(1)&gt;" in text, path


async def test_large_pages_are_gzipped_for_clients_that_take_it(dash: Dash) -> None:
    plain = await dash.client.get("/admin/nodes", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers
    packed = await dash.client.get("/admin/nodes", headers={"Accept-Encoding": "gzip"})
    assert packed.headers["content-encoding"] == "gzip"
    assert packed.text == plain.text  # httpx unpacks it
    assert int(packed.headers["content-length"]) < len(plain.content) / 3


async def test_a_model_the_controller_does_not_know_yet_still_renders(dash: Dash) -> None:
    def model(name: str) -> dict[str, Any] | None:
        found = dash.sources.model(name)
        return None if found is None else {**found, "status": {"state": "unknown"}}

    sources = dataclasses.replace(dash.sources, model=model)
    async with client_for(sources) as client:
        page = await client.get("/admin/models/model-001")
    assert page.status_code == 200 and "unknown" in page.text
