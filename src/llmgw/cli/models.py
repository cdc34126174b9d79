"""`llmgw models`: list, show, add, remove, explain and activate catalog models, and reload
the server's config file (`reload`), through the admin API.

Talks HTTP to a running server's admin listener, like `llmgw nodes` (same
`--admin` / `--admin-key` / `--admin-config` options, resolved flag, then
environment, then config file, then default; same `error: ...` lines and exit
codes: 1 when the admin API cannot be reached or fails, 2 for bad input, an
unknown model or a model the server refuses). `activate` starts a replica and
follows it on stderr (`llmgw.cli.activation`); `pull` downloads the weights onto
nodes ahead of demand and follows the downloads (`llmgw.cli.pull`). `add` takes
one model from a YAML or JSON file (`--file`, the shape of one `models:` entry
of the config file) or builds a one-profile model from flags; the server
validates it, so its errors name the model, the profile and the field.
`explain` and `add --dry-run` show, per profile, the nodes that fit and why
each other node does not.
Imports only typer and the standard library at the top (yaml and httpx when a
command runs), so `llmgw --help` stays fast.

Not guaranteed: a stable text layout; scripts should use `--json`.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer

from llmgw.cli.activation import activate_model
from llmgw.cli.adminclient import (
    EXIT_BAD_INPUT,
    AdminConfigOption,
    AdminKeyOption,
    AdminOption,
    PollOption,
    fail,
    request,
    resolve_admin,
)
from llmgw.cli.pull import pull_model
from llmgw.cli.reload import reload_models
from llmgw.cli.rollout import rollout_app
from llmgw.cli.storeopts import JsonOption, print_json, render_table

models_app = typer.Typer(
    name="models",
    help=(
        "See and change the model catalog: list, show, add, remove, explain, activate, pull, "
        "rollout."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

models_app.add_typer(rollout_app)

ModelArgument = Annotated[
    str, typer.Argument(help="The model's name or an alias, as `llmgw models list` shows.")
]


def model_path(name: str, suffix: str = "") -> str:
    if not name.strip():
        fail("MODEL must not be empty", EXIT_BAD_INPUT)
    return f"/admin/api/models/{quote(name, safe='')}{suffix}"


# ---- reading a model from a file or flags ----


def read_model_file(path: Path) -> dict[str, Any]:
    """One model from a YAML or JSON file; `error: PATH: ...` (exit 2) when it is not one."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        fail(f"{path}: file not found", EXIT_BAD_INPUT)
    except OSError as exc:
        fail(f"{path}: cannot read the file: {exc.strerror}", EXIT_BAD_INPUT)
    try:
        data = yaml.safe_load(text)  # JSON is YAML too
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        fail(f"{path}: not valid YAML or JSON{where}: {problem}", EXIT_BAD_INPUT)
    if isinstance(data, dict) and set(data) == {"models"}:
        fail(
            f"{path}: this is a `models:` list; give one model, the shape of one entry "
            "of that list (name, weights, profiles, ...)",
            EXIT_BAD_INPUT,
        )
    if not isinstance(data, dict):
        fail(
            f"{path}: the file must hold one model as a mapping (name, weights, profiles, "
            f"...), not {type(data).__name__}",
            EXIT_BAD_INPUT,
        )
    return data


def _number_or_text(value: str) -> int | float | str:
    """'300' as 300 and '-1' as -1, so the JSON reads naturally; '5m' stays text."""
    with contextlib.suppress(ValueError):
        return int(value)
    try:
        return float(value)
    except ValueError:
        return value


def model_from_flags(
    *,
    name: str | None,
    weights: str | None,
    engine: str | None,
    gpus: int | None,
    gpu_memory: str | None,
    engine_args: list[str],
    min_replicas: int | None,
    max_replicas: int | None,
    keep_alive: str | None,
    aliases: list[str],
    activation: bool,
    target_in_flight: int | None = None,
    scale_down_delay: str | None = None,
    target_queue_depth: int | None = None,
    target_kv_use: float | None = None,
    target_queue_wait: float | None = None,
    sleep_after: str | None = None,
    prefetch: int | None = None,
    adapter_of: str | None = None,
) -> dict[str, Any]:
    """A one-profile model from `add`'s flags; unset flags keep the server's defaults.
    With `adapter_of`, a LoRA adapter of that base (name, weights and aliases only)."""
    if adapter_of is not None:
        return _adapter_from_flags(
            name=name, weights=weights, adapter_of=adapter_of, aliases=aliases
        )
    missing = [
        flag
        for flag, value in (("--name", name), ("--weights", weights), ("--engine", engine))
        if not value
    ]
    if missing:
        fail(
            f"give {', '.join(missing)} (or --file with a whole model); e.g. llmgw models add "
            "--name llama-3-8b --weights meta-llama/Meta-Llama-3-8B-Instruct --engine vllm "
            "--gpus 1",
            EXIT_BAD_INPUT,
        )
    profile: dict[str, Any] = {"engine": engine}
    if gpus is not None:
        profile["gpus"] = gpus
    if gpu_memory is not None:
        profile["gpu_memory"] = gpu_memory
    if engine_args:
        profile["engine_args"] = engine_args
    model: dict[str, Any] = {"name": name, "weights": weights, "profiles": [profile]}
    if aliases:
        model["aliases"] = aliases
    if min_replicas is not None:
        model["min_replicas"] = min_replicas
    if max_replicas is not None:
        model["max_replicas"] = max_replicas
    if keep_alive is not None:
        model["keep_alive"] = _number_or_text(keep_alive)
    if sleep_after is not None:
        model["sleep_after"] = _number_or_text(sleep_after)
    if prefetch is not None:
        model["prefetch"] = prefetch
    if not activation:
        model["activation"] = False
    if target_in_flight is not None:
        model["target_in_flight"] = target_in_flight
    if target_queue_depth is not None:
        model["target_queue_depth"] = target_queue_depth
    if target_kv_use is not None:
        model["target_kv_use"] = target_kv_use
    if target_queue_wait is not None:
        model["target_queue_wait"] = target_queue_wait
    if scale_down_delay is not None:
        model["scale_down_delay"] = _number_or_text(scale_down_delay)
    return model


def _adapter_from_flags(
    *, name: str | None, weights: str | None, adapter_of: str, aliases: list[str]
) -> dict[str, Any]:
    missing = [flag for flag, value in (("NAME", name), ("--weights", weights)) if not value]
    if missing:
        fail(
            f"give {' and '.join(missing)} for the adapter; e.g. llmgw models add sql-lora "
            f"--adapter-of {adapter_of} --weights /srv/adapters/sql-lora",
            EXIT_BAD_INPUT,
        )
    adapter: dict[str, Any] = {"name": name, "adapter_of": adapter_of, "weights": weights}
    if aliases:
        adapter["aliases"] = aliases
    return adapter


# ---- formatting ----


def _gib(value: int) -> str:
    return f"{value / (1 << 30):g} GiB" if value else "any"


def _keep_alive(value: float) -> str:
    if value < 0:
        return "pinned"
    if value == 0:
        return "0 (unload when idle)"
    if value % 3600 == 0:
        return f"{value / 3600:g}h"
    if value % 60 == 0:
        return f"{value / 60:g}m"
    return f"{value:g}s"


def _scaling(model: dict[str, Any]) -> str:
    targets = []
    if model.get("target_in_flight"):
        targets.append(f"{model['target_in_flight']} requests in flight")
    if model.get("target_queue_depth"):
        waiting = model["target_queue_depth"]
        targets.append(f"{waiting} request{'' if waiting == 1 else 's'} waiting")
    if model.get("target_kv_use"):
        targets.append(f"{float(model['target_kv_use']):.0%} KV-cache use")
    rules = [f"one replica per {' or per '.join(targets)}"] if targets else []
    if model.get("target_queue_wait"):
        rules.append(
            f"one more than are Ready while requests wait over "
            f"{float(model['target_queue_wait']):g} s in the routers' queues"
        )
    if not rules:
        return "min replicas, or one while in use"
    delay = float(model.get("scale_down_delay", 60))
    return f"{', or '.join(rules)}, down after {_keep_alive(delay)} of lower load"


def _load_lines(model: dict[str, Any]) -> list[str]:
    """The load signals the model's targets read, and what is missing."""
    load = _status(model).get("load")
    if not isinstance(load, dict) or not (
        model.get("target_in_flight")
        or model.get("target_queue_depth")
        or model.get("target_queue_wait")
        or model.get("target_kv_use")
    ):
        return []
    engines = load.get("engine_waiting")
    kv = load.get("kv_use")
    lines = [
        f"load:        {load.get('in_flight', 0)} in flight; {load.get('waiting', 0)} waiting "
        f"({'not reported' if engines is None else engines} in engines, "
        f"{load.get('router_queued', 0)} in routers, longest "
        f"{load.get('queue_wait_seconds', 0)} s), {load.get('queue_depth', 0)} per replica; "
        f"KV cache {'not reported' if kv is None else f'{float(kv):.0%} used'}",
    ]
    lines += [f"  ! {message}" for message in load.get("missing") or []]
    return lines


def _routing(model: dict[str, Any]) -> str:
    routing = model.get("routing")
    scorers = routing.get("scorers") if isinstance(routing, dict) else None
    if not isinstance(scorers, dict):
        return "the server's (router.routing)"
    return " ".join(f"{name}={weight:g}" for name, weight in scorers.items())


def _pairs(mapping: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(mapping.items())) or "-"


def _status(model: dict[str, Any]) -> dict[str, Any]:
    status = model.get("status")
    return status if isinstance(status, dict) else {}


def _replicas(model: dict[str, Any]) -> str:
    status = _status(model)
    ready, desired = status.get("ready_replicas"), status.get("desired_replicas")
    if ready is None and desired is None:
        return "-"
    return f"{ready if ready is not None else '-'}/{desired if desired is not None else '-'}"


def _profiles_summary(model: dict[str, Any]) -> str:
    return ", ".join(
        f"{p['name']} ({p['engine']}, {p['gpus']} GPU)"
        if p["gpus"]
        else f"{p['name']} ({p['engine']}, CPU)"
        for p in model["profiles"]
    )


def _list_table(models: list[dict[str, Any]]) -> str:
    rows: list[list[str]] = []
    for m in models:
        rows.append(
            [
                m["name"],
                m.get("source", "-"),
                str(_status(m).get("state", "-")),
                _replicas(m),
                f"{m['min_replicas']}-{m['max_replicas']}",
                _keep_alive(m["keep_alive"]),
                _profiles_summary(m),
                ",".join(m["aliases"]) or "-",
            ]
        )
        # Adapters under their base: they run in its replicas.
        rows += [
            [
                f"  {a['name']}",
                a.get("source", "-"),
                "-",
                "-",
                "-",
                "-",
                f"LoRA adapter of {m['name']}",
                ",".join(a["aliases"]) or "-",
            ]
            for a in m.get("adapters") or []
        ]
    headers = ["MODEL", "SOURCE", "STATE", "READY", "REPLICAS", "KEEP ALIVE", "PROFILES", "ALIASES"]
    return render_table(headers, rows, right=frozenset({3}))


def _wake_line(status: dict[str, Any]) -> list[str]:
    wake = status.get("last_wake")
    if not isinstance(wake, dict):
        return []
    return [f"last wake:   replica {wake.get('replica')} woke in {wake.get('seconds')} s"]


def _gb(size: int) -> str:
    """Bytes as the hub counts them: `15.2 GB`, `30.0 MB`."""
    return f"{size / 1e9:.1f} GB" if size >= 10**9 else f"{size / 1e6:.1f} MB"


def _weights_lines(model: dict[str, Any]) -> list[str]:
    """Where `prefetch` keeps the weights, and an operator's last pull, per node."""
    lines: list[str] = []
    kept = model.get("prefetched")
    if isinstance(kept, dict):
        held = kept.get("held_on") or []
        lines.append(
            f"prefetch:    {kept.get('weights')} on {len(held)} of {kept.get('wanted')} nodes"
            + (f" ({', '.join(held)})" if held else "")
        )
        lines += [f"  {r['node']}: {r['message']}" for r in kept.get("pulling") or []]
    elif model.get("prefetch"):
        lines.append(f"prefetch:    {model['prefetch']} nodes")
    pull = model.get("pull")
    if isinstance(pull, dict):
        lines.append(f"pull:        {pull.get('weights')} {pull.get('state')}")
        lines += [f"  {r['node']}: {r['state']}: {r['message']}" for r in pull.get("nodes") or []]
    return lines


def _adapter_text(adapter: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"adapter:     {adapter['name']} ({adapter.get('source', '-')})",
            f"base model:  {adapter['adapter_of']} (loaded at run time into its replicas)",
            f"aliases:     {', '.join(adapter['aliases']) or '-'}",
            f"weights:     {adapter['weights']}"
            + (f" (commit {adapter['weights_commit']})" if adapter.get("weights_commit") else ""),
        ]
    )


def _adapters_lines(model: dict[str, Any]) -> list[str]:
    adapters = model.get("adapters") or []
    if not adapters:
        return []
    lines = ["", "LoRA adapters of this model:"]
    for a in adapters:
        aliases = f" (aliases: {', '.join(a['aliases'])})" if a["aliases"] else ""
        lines.append(f"  {a['name']}: {a['weights']}{aliases} [{a.get('source', '-')}]")
    return lines


def _show_text(model: dict[str, Any]) -> str:
    if model.get("adapter_of"):
        return _adapter_text(model)
    status = _status(model)
    lines = [
        f"model:       {model['name']} ({model.get('source', '-')})",
        f"aliases:     {', '.join(model['aliases']) or '-'}",
        f"weights:     {model['weights']}"
        + (f" (commit {model['weights_commit']})" if model.get("weights_commit") else "")
        + (f", {_gb(int(model['weights_bytes']))}" if model.get("weights_bytes") else ""),
        f"replicas:    {model['min_replicas']} to {model['max_replicas']}",
        f"keep alive:  {_keep_alive(model['keep_alive'])}",
        *(
            [f"sleep after: {_keep_alive(model['sleep_after'])}"]
            if model.get("sleep_after") is not None
            else []
        ),
        f"scaling:     {_scaling(model)}",
        *_load_lines(model),
        f"routing:     {_routing(model)}",
        f"activation:  {'on request' if model['activation'] else 'off (operator starts it)'}",
        f"state:       {status.get('state', '-')} ({_replicas(model)} ready)",
        *_wake_line(status),
        *_weights_lines(model),
        "",
        "profiles (in order of preference):",
    ]
    for index, p in enumerate(model["profiles"]):
        gpus = (
            f"{p['gpus']} x {_gib(p['gpu_memory'])}"
            + (f" {p['gpu_kind']}" if p.get("gpu_kind") else "")
            + (
                f", tensor parallel {p['tensor_parallel_size']}"
                if p["tensor_parallel_size"]
                else ""
            )
            if p["gpus"]
            else "none (CPU)"
        )
        lines += [
            f"  {index + 1}. {p['name']}: {p['engine']}",
            f"     GPUs:    {gpus}",
            f"     labels:  {_pairs(p['labels'])}",
            f"     args:    {' '.join(p['engine_args']) or '-'}",
        ]
        if p["env"]:
            lines.append(f"     env:     {_pairs(p['env'])}")
        if p["gpu_memory_utilization"]:
            lines.append(f"     memory:  {p['gpu_memory_utilization']:g} of each GPU")
        slots = p.get("adapters")
        if slots:
            lines.append(
                f"     adapters: up to {slots['max_loaded']} LoRA adapters loaded at once, "
                f"rank up to {slots['max_rank']}"
            )
    lines += _adapters_lines(model)
    versions = model.get("versions")
    if isinstance(versions, list) and len(versions) == 2:
        stable, canary = versions
        lines += [
            "",
            "versions (new conversations split by weight):",
            f"  {stable['name']}: weight {stable['weight']}, the spec above",
            f"  {canary['name']}: weight {canary['weight']}, weights {canary['weights']}",
        ]
        for index, p in enumerate(canary["profiles"]):
            args = " ".join(p["engine_args"]) or "-"
            lines.append(f"     {index + 1}. {p['name']}: {p['engine']}, args: {args}")
    replicas = status.get("replicas")
    if isinstance(replicas, list) and replicas:
        versioned = any(r.get("version") for r in replicas)
        rows = [
            [
                str(r.get("id", "-")),
                str(r.get("node", "-")),
                str(r.get("state", "-")),
                *([str(r.get("version") or "-")] if versioned else []),
                ",".join(str(g) for g in r.get("gpus") or []) or "-",
                str(r.get("endpoint_url") or "-"),
            ]
            for r in replicas
        ]
        heads = ["REPLICA", "NODE", "STATE", *(["VERSION"] if versioned else []), "GPUS"]
        table = render_table([*heads, "ENDPOINT"], rows)
        lines += ["", "replicas:", *("  " + line for line in table.splitlines())]
        # Which LoRA adapters each replica's engine has loaded (as its agent reports).
        lines += [
            f"  replica {r.get('id')} has adapters loaded: {', '.join(r['adapters'])}"
            for r in replicas
            if r.get("adapters")
        ]
        # What a starting replica is doing (downloading its weights: how far, how long).
        lines += [
            f"  replica {r.get('id')}: {r['message']}"
            for r in replicas
            if r.get("state") == "starting" and str(r.get("message") or "").startswith("download")
        ]
        # A multi-node replica's row is its rank 0's; its shards by rank follow.
        for r in replicas:
            shards = r.get("shards") or []
            if len(shards) > 1:
                ranks = ", ".join(
                    f"rank {s.get('rank')} on {s.get('node')} ({s.get('state')})" for s in shards
                )
                lines.append(f"  replica {r.get('id')} spans {len(shards)} nodes: {ranks}")
    unreachable = [
        f"  ! replica {r.get('replica')} is ready but this server cannot reach it at "
        f"{r.get('url')}: {r.get('error')} (not routed to from here)"
        for r in status.get("reachability") or []
        if isinstance(r, dict) and r.get("state") == "unreachable"
    ]
    if unreachable:
        lines += ["", *unreachable]
    rollout = status.get("rollout")
    if isinstance(rollout, dict):
        if rollout.get("state") == "halted":
            lines += ["", f"rollout stopped: {rollout.get('reason')}"]
        else:
            lines += ["", f"rolling out a new spec: {rollout.get('step')}"]
    if status.get("canary_halt"):
        lines += ["", f"canary stopped: {status.get('canary_halt')}"]
    for key, label in (("last_failure", "last failure"), ("unplaceable", "unplaceable")):
        value = status.get(key)
        if isinstance(value, dict):
            value = value.get("summary") or value.get("message")
        if value:
            lines += ["", f"{label}: {value}"]
    return "\n".join(lines)


def explain_text(explanation: dict[str, Any]) -> str:
    """Per profile: the nodes that fit, and each rejected node with its reason."""
    name = explanation.get("model", "?")
    placement = explanation.get("placement")
    if isinstance(placement, dict):
        gpus = ",".join(str(g) for g in placement.get("gpus") or []) or "none"
        head = (
            f"model {name}: the next replica goes to node {placement.get('node')} "
            f"(profile {placement.get('profile')}, GPUs {gpus})"
        )
        shards = placement.get("shards") or []
        if len(shards) > 1:
            ranks = ", ".join(
                f"rank {s.get('rank')} on {s.get('node')} "
                f"(GPUs {','.join(str(g) for g in s.get('gpus') or []) or 'none'})"
                for s in shards
            )
            head = (
                f"model {name}: the next replica goes to {placement.get('fabric')} "
                f"(profile {placement.get('profile')}): {ranks}"
            )
    elif explanation.get("placeable"):
        head = f"model {name}: placeable"
    else:
        head = f"model {name}: no node can take a replica now"
    lines = [head]
    for verdict in explanation.get("profiles") or []:
        fits = verdict.get("fits") or []
        rejected = verdict.get("rejected") or []
        lines += ["", f"profile {verdict.get('profile')}:"]
        lines.append(f"  fits:     {', '.join(fits) if fits else 'no node'}")
        notes = verdict.get("weights") or []
        if notes:
            lines.append("  weights:")
            lines += [f"    {note}" for note in notes]
        groups = verdict.get("groups") or []
        if groups:
            lines.append("  fabric groups short of nodes:")
            lines += [f"    {group}" for group in groups]
        if rejected:
            lines.append("  rejected:")
            width = max(len(str(r.get("node"))) for r in rejected)
            lines += [f"    {str(r.get('node')).ljust(width)}  {r.get('reason')}" for r in rejected]
    summary = explanation.get("summary")
    if summary and summary != head:
        lines += ["", str(summary)]
    return "\n".join(lines)


# ---- commands ----


@models_app.command("list")
def list_models(
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """List the catalog: source, state, ready replicas, keep-alive, profiles, aliases."""
    body = request("GET", resolve_admin(admin, admin_key, admin_config), "/admin/api/models")
    models: list[dict[str, Any]] = body["models"]
    skipped: list[dict[str, Any]] = body.get("skipped") or []
    if json_out:
        print_json(body)
        return
    if models:
        typer.echo(_list_table(models))
    else:
        typer.echo(
            "no models: declare them under `models:` in the config file, or `llmgw models add`"
        )
    for entry in skipped:
        typer.echo(f"skipped stored model {entry['name']}: {entry['reason']}", err=True)


@models_app.command("show")
def show(
    name: ModelArgument,
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """Show one model: its profiles, scaling rules and replicas."""
    model = request("GET", resolve_admin(admin, admin_key, admin_config), model_path(name))
    if json_out:
        print_json(model)
        return
    typer.echo(_show_text(model))


@models_app.command("add")
def add(
    model_name: Annotated[
        str | None,
        typer.Argument(
            metavar="[NAME]", help="The model's name (the same as --name).", show_default=False
        ),
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            "-f",
            help="YAML or JSON file with one model (the shape of a `models:` entry).",
            show_default=False,
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Model name clients send.")] = None,
    weights: Annotated[
        str | None, typer.Option(help="Local path, GGUF file or hub id of the weights.")
    ] = None,
    engine: Annotated[
        str | None, typer.Option(help="vllm, sglang, llamacpp or sim.", show_default=False)
    ] = None,
    gpus: Annotated[
        int | None, typer.Option(help="GPUs per replica [default: 0].", show_default=False)
    ] = None,
    gpu_memory: Annotated[
        str | None,
        typer.Option(
            help="Free memory each GPU needs, e.g. 24GiB [default: 0, any GPU].",
            show_default=False,
        ),
    ] = None,
    engine_arg: Annotated[
        list[str] | None,
        typer.Option(
            "--engine-arg", help="Extra engine argument (repeatable).", show_default=False
        ),
    ] = None,
    min_replicas: Annotated[
        int | None,
        typer.Option(help="Replicas kept even when idle [default: 0].", show_default=False),
    ] = None,
    max_replicas: Annotated[
        int | None, typer.Option(help="Most replicas under load [default: 1].", show_default=False)
    ] = None,
    keep_alive: Annotated[
        str | None,
        typer.Option(
            help="Idle time before scale-down: 300, 5m, 1h; -1 pins [default: 5m].",
            show_default=False,
        ),
    ] = None,
    sleep_after: Annotated[
        str | None,
        typer.Option(
            help="Idle time before replicas sleep (GPU memory released, woken by the next "
            "request), shorter than --keep-alive: 60, 2m [default: off].",
            show_default=False,
        ),
    ] = None,
    prefetch: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Keep the hub weights on this many nodes that could run the model, pulled "
            "ahead of demand and again when removed [default: 0, off].",
            show_default=False,
        ),
    ] = None,
    target_in_flight: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Scale on load: one replica per this many requests in flight, up to "
            "--max-replicas [default: off].",
            show_default=False,
        ),
    ] = None,
    target_queue_depth: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Scale on waiting requests: one replica per this many waiting (in the "
            "engines and the routers' queues), up to --max-replicas [default: off].",
            show_default=False,
        ),
    ] = None,
    target_kv_use: Annotated[
        float | None,
        typer.Option(
            min=0.01,
            max=1.0,
            help="Scale on KV-cache use: keep the mean over Ready replicas at or below "
            "this fraction, e.g. 0.8, up to --max-replicas [default: off].",
            show_default=False,
        ),
    ] = None,
    target_queue_wait: Annotated[
        float | None,
        typer.Option(
            help="Scale on queue wait (seconds, above 0): one replica more than are Ready "
            "while a request has waited longer in a router's queue, one at a time, up to "
            "--max-replicas [default: off].",
            show_default=False,
        ),
    ] = None,
    scale_down_delay: Annotated[
        str | None,
        typer.Option(
            help="How long load must stay lower before load replicas stop: 60, 90s, 5m "
            "[default: 60s].",
            show_default=False,
        ),
    ] = None,
    alias: Annotated[
        list[str] | None,
        typer.Option(
            "--alias", help="Another name for the model (repeatable).", show_default=False
        ),
    ] = None,
    no_activation: Annotated[
        bool, typer.Option("--no-activation", help="Never start the model on a request.")
    ] = False,
    adapter_of: Annotated[
        str | None,
        typer.Option(
            "--adapter-of",
            help="Add a LoRA adapter of this base model instead of a model: --weights is the "
            "adapter's directory or hub repo, loaded into the base's replicas (the base needs "
            "a profile with adapters:); only NAME, --weights and --alias go with it.",
            show_default=False,
        ),
    ] = None,
    replace: Annotated[
        bool, typer.Option("--replace", help="Replace the stored model of that name.")
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Only show where the model would go; store nothing."),
    ] = False,
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """Add a model to the catalog (kept in the server's store), or replace one."""
    if target_queue_wait is not None and not (
        math.isfinite(target_queue_wait) and target_queue_wait > 0
    ):
        fail(
            f"--target-queue-wait {target_queue_wait:g}: give the longest wait in seconds a "
            "request may have in a router's queue before a replica is added, a number above "
            "0, e.g. --target-queue-wait 2",
            EXIT_BAD_INPUT,
        )
    if model_name is not None and name is not None and model_name != name:
        fail(f"NAME is {model_name!r} but --name is {name!r}; give the name once", EXIT_BAD_INPUT)
    name = name if name is not None else model_name
    served = (
        engine, gpus, gpu_memory, min_replicas, max_replicas, keep_alive,
        target_in_flight, scale_down_delay, target_queue_depth, target_kv_use,
        target_queue_wait, sleep_after, prefetch,
    )  # fmt: skip
    if adapter_of is not None and (
        any(v is not None for v in served) or engine_arg or no_activation
    ):
        fail(
            "--adapter-of adds a LoRA adapter, which runs in its base's replicas: give only "
            "NAME, --weights and --alias with it (engine, GPUs, replicas and scaling are the "
            "base model's)",
            EXIT_BAD_INPUT,
        )
    flags_given = any(v is not None for v in (name, weights, adapter_of, *served)) or bool(
        engine_arg or alias or no_activation
    )
    if file is not None:
        if flags_given:
            fail(
                "give either --file or the model flags (--name, --weights, ...), not both",
                EXIT_BAD_INPUT,
            )
        model = read_model_file(file)
    else:
        model = model_from_flags(
            name=name,
            weights=weights,
            engine=engine,
            gpus=gpus,
            gpu_memory=gpu_memory,
            engine_args=engine_arg or [],
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            keep_alive=keep_alive,
            aliases=alias or [],
            activation=not no_activation,
            target_in_flight=target_in_flight,
            scale_down_delay=scale_down_delay,
            target_queue_depth=target_queue_depth,
            target_kv_use=target_kv_use,
            target_queue_wait=target_queue_wait,
            sleep_after=sleep_after,
            prefetch=prefetch,
            adapter_of=adapter_of,
        )
    if dry_run and replace:
        fail("--dry-run stores nothing, so --replace means nothing with it", EXIT_BAD_INPUT)
    prefix = f"{file}: " if file is not None else ""
    if dry_run:
        path, method = "/admin/api/placement/dry-run", "POST"
    elif replace:
        target = model.get("name")
        if not isinstance(target, str) or not target:
            fail(f"{prefix}the model has no name, so there is nothing to replace", EXIT_BAD_INPUT)
        path, method = model_path(target), "PUT"
    else:
        path, method = "/admin/api/models", "POST"
    answer = request(
        method, resolve_admin(admin, admin_key, admin_config), path, json_body=model, prefix=prefix
    )
    if json_out:
        print_json(answer)
    elif dry_run:
        typer.echo(explain_text(answer))
    else:
        verb = "replaced" if replace else "added"
        what = (
            f"adapter {answer['name']} of {answer['adapter_of']}"
            if answer.get("adapter_of")
            else f"model {answer['name']}"
        )
        typer.echo(f"{what} {verb}: it is kept in the server's store")


@models_app.command("remove")
def remove(
    name: ModelArgument,
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """Remove a model added through the API; its replicas are stopped."""
    answer = request("DELETE", resolve_admin(admin, admin_key, admin_config), model_path(name))
    if json_out:
        print_json(answer)
    elif answer.get("discarded"):
        typer.echo(f"stored model {answer['name']} discarded (it was skipped: {answer['reason']})")
    else:
        typer.echo(f"model {answer['name']} removed from the catalog; its replicas will stop")


models_app.command("reload")(reload_models)
models_app.command("pull")(pull_model)


@models_app.command("explain")
def explain(
    name: ModelArgument,
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """Explain placement: per profile, the nodes that fit and why the others do not."""
    answer = request(
        "GET", resolve_admin(admin, admin_key, admin_config), model_path(name, "/placement")
    )
    if json_out:
        print_json(answer)
        return
    typer.echo(explain_text(answer))


@models_app.command("activate")
def activate(
    name: ModelArgument,
    timeout: Annotated[
        float,
        typer.Option(
            min=0.1, help="Seconds to wait for a ready replica before giving up (exit 1)."
        ),
    ] = 600.0,
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
    poll_interval: PollOption = 0.5,
) -> None:
    """Start a replica now and wait until it is ready, showing its progress on stderr.

    Ends with "model X is ready (N replicas) after T s" (exit 0), or the reason
    the server gives and the engine's last output (exit 1). --json prints the
    model's final status on stdout.
    """
    target = resolve_admin(admin, admin_key, admin_config)
    activate_model(
        target,
        name,
        model_path(name),
        timeout=timeout,
        poll=poll_interval,
        json_out=json_out,
    )
