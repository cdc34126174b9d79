"""LoRA adapters loaded on request, end to end: a real `llmgw server`, a real agent and
the sim's copy of vLLM's runtime LoRA API. A request for an adapter that no replica has
starts its base (none runs), loads the adapter into the replica and is answered by it;
over the profile's `max_loaded` the least recently used idle adapter is unloaded; a
request for it loads it again; an adapter the engine refuses is answered at once with
the engine's own words; `models show BASE` lists what each replica has loaded.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
from lora_adapters import sim_adapter
from procs import llmgw
from test_control_plane import Fleet, fleet, wait_for


def models(adapters: Path) -> str:
    entries = "".join(
        f"  - name: {name}\n    adapter_of: base\n    weights: {adapters / name}\n"
        for name in ("red", "green", "blue", "wide")
    )
    return (
        "  - name: base\n    weights: none\n"
        "    profiles: [{name: sim, engine: sim, gpus: 1,\n"
        "                adapters: {max_loaded: 2, max_rank: 8}}]\n"
        + entries
        + f"  - name: ghost\n    adapter_of: base\n    weights: {adapters / 'ghost'}\n"
    )


def engine_adapters(f: Fleet) -> list[str]:
    """The adapters the base's engine lists in its /v1/models, by name."""
    [replica] = f.ready_replicas("base")
    cards = httpx.get(str(replica["endpoint_url"]) + "/v1/models", timeout=10).json()["data"]
    return sorted(c["id"] for c in cards if c.get("parent") == "base")


def reported(f: Fleet) -> list[str]:
    """The adapters the base's replica has loaded, as its agent reported them."""
    replicas = f.ready_replicas("base")
    return sorted(replicas[0]["adapters"]) if replicas else []


def test_adapters_load_on_request_evict_the_idle_one_and_fail_in_the_engines_words(
    tmp_path: Path,
) -> None:
    root = tmp_path / "adapters"
    for name in ("red", "green", "blue"):
        sim_adapter(root, name, rank=8)
    sim_adapter(root, "wide", rank=16)
    with fleet(tmp_path, models(root), nodes=1) as f:
        assert f.status("base")["replicas"] == []  # nothing runs until asked

        # An adapter no replica has: its base starts, the adapter loads, it answers.
        red = f.chat("red")
        assert red.status_code == 200, red.text
        assert red.json()["model"] == "red"
        assert engine_adapters(f) == ["red"]
        wait_for(lambda: reported(f) == ["red"], "the agent to report red loaded")

        green = f.chat("green")
        assert green.status_code == 200, green.text
        assert engine_adapters(f) == ["green", "red"]

        # Over max_loaded (2): red, used least recently and idle, makes room for blue.
        blue = f.chat("blue")
        assert blue.status_code == 200, blue.text
        assert blue.json()["model"] == "blue"
        assert engine_adapters(f) == ["blue", "green"]
        wait_for(lambda: reported(f) == ["blue", "green"], "the agent to report red gone")

        # red is asked for again: it is loaded again (green is now the idle oldest).
        again = f.chat("red")
        assert again.status_code == 200, again.text
        assert again.json()["model"] == "red"
        assert engine_adapters(f) == ["blue", "red"]

        shown = subprocess.run(
            llmgw("models", "show", "base", "--admin", f.server.admin),
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        [replica] = f.ready_replicas("base")
        assert f"replica {replica['id']} has adapters loaded: " in shown.stdout
        assert shown.stdout.split("has adapters loaded: ")[1].splitlines()[0] in (
            "blue, red",
            "red, blue",
        )

        # The engine refuses: answered at once, a client error, in the engine's words.
        wide = f.chat("wide")
        assert wide.status_code == 400, wide.text
        error = wide.json()["error"]
        assert error["code"] == "adapter_refused"
        assert "LoRA rank 16 is greater than max_lora_rank 8" in error["message"]
        ghost = f.chat("ghost")
        assert ghost.status_code == 400, ghost.text
        assert "Loading lora ghost failed: No adapter found for" in ghost.json()["error"]["message"]
        # Neither is listed as loaded; room was made first (blue, idle and least recently
        # used, was unloaded), and red, used last, stays.
        assert engine_adapters(f) == ["red"]
        wait_for(lambda: reported(f) == ["red"], "the agent to report only red loaded")
        assert f.chat("red").status_code == 200
