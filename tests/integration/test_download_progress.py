"""A hub download, seen everywhere a person looks while it runs: the file being
fetched in the admin API, `llmgw models show` and a waiting stream's keep-alive
comments; its start, quarters and end as events in the admin API and `llmgw events`.

A real server, a real agent and a `llmgw sim` engine (`hub_fleet`); the hub
stand-in paces its bytes so the 30 MB download lasts about 5 s.
"""

from __future__ import annotations

import re
import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx
from hub_fleet import RATE, WEIGHT_BYTES, config, events, hub_fleet, models_show, shards, tiny_repo
from hub_standin import HubStandin
from procs import llmgw, wait_for

CONFIG_BYTES = len(b'{"model_type": "llama"}')


def test_a_download_names_its_file_everywhere_and_its_start_quarters_and_end_are_events(
    tmp_path: Path, hub: HubStandin
) -> None:
    repo = hub.add(tiny_repo())
    sha = repo.refs["main"]
    short = f"org/tiny@{sha[:7]}"
    hub.bytes_per_second = RATE
    with hub_fleet(tmp_path, hub, config(f"org/tiny@{sha}", min_replicas=0)) as fleet:
        server = fleet.server
        wait_for(
            lambda: httpx.get(server.admin + "/admin/api/nodes", timeout=10).json()["nodes"],
            "the node to register",
        )
        comments: list[str] = []
        done: list[str] = []

        def ask() -> None:
            body = {
                "model": "tiny",
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
            }
            with httpx.stream(
                "POST", server.url + "/v1/chat/completions", json=body, timeout=120
            ) as answer:
                for line in answer.iter_lines():
                    if line.startswith(":"):
                        comments.append(line)
                    elif line.startswith("data:"):
                        done.append(line)

        waiting = threading.Thread(target=ask, name="waiting request")
        waiting.start()
        try:
            # The admin API: the shard's download, with the file in flight.
            def fetching() -> list[dict[str, Any]]:
                return [
                    s["download"]
                    for s in shards(server)
                    if s.get("download") and s["download"]["file"] and s["download"]["percent"]
                ]

            [download] = wait_for(fetching, "the shard's download to name its file")
            assert download["file"] == "model.safetensors", download
            assert download["files"] == ["model.safetensors"], download
            assert (download["repo"], download["revision"]) == ("org/tiny", sha), download
            assert download["total_bytes"] == WEIGHT_BYTES + CONFIG_BYTES, download
            assert 0 < download["done_bytes"] <= download["total_bytes"], download
            assert download["started"] is not None, download
            # The model's replica carries the same download.
            model = httpx.get(server.admin + "/admin/api/models/tiny", timeout=10).json()
            [replica] = model["status"]["replicas"]
            assert replica["download"] is None or replica["download"]["repo"] == "org/tiny"

            # `llmgw models show`: the progress line names the file.
            def shown_with_file() -> str | None:
                text = models_show(server)
                return text if ", model.safetensors" in text else None

            shown = wait_for(shown_with_file, "models show to name the file being fetched")
            assert re.search(
                rf": downloading {re.escape(short)} \d+% of 30\.0 MB, model\.safetensors", shown
            ), shown
        finally:
            waiting.join(timeout=150)
        assert not waiting.is_alive(), "the waiting request did not end"
        assert done and done[-1] == "data: [DONE]", (done, comments)
        # The waiting stream's comments name the file too.
        named = [
            c
            for c in comments
            if c.startswith(f": llmgw downloading {short} ") and ", model.safetensors" in c
        ]
        assert named, comments

        # Events: its start, the quarters it passed, and its end with size and duration.
        def ended() -> list[dict[str, Any]]:
            return [
                e
                for e in events(server, model="tiny")
                if e["kind"] == "download" and e["message"].startswith(f"downloaded {short}")
            ]

        [end] = wait_for(ended, "the download's end as an event")
        assert re.fullmatch(
            rf"downloaded {re.escape(short)} \(30\.0 MB\) on node node-a in \d+ s", end["message"]
        ), end
        assert end["node"] == "node-a", end
        told = [e["message"] for e in events(server, model="tiny") if e["kind"] == "download"]
        assert told[0] == end["message"], told  # newest first: the end is the last told
        assert told[-1] == f"downloading {short} (30.0 MB) on node node-a", told
        quarters = [
            int(m[1])
            for t in told
            if (m := re.match(rf"{re.escape(short)} on node node-a: (\d+)%", t))
        ]
        # 10 MB pieces land one by one: the first passes 25%, the second 50%.
        assert quarters and all(25 <= q < 100 for q in quarters), told
        assert quarters == sorted(quarters, reverse=True), told
        assert len(told) == 2 + len(quarters), told
        # Each quarter is told once: two shards' reports would not repeat it.
        assert len(set(quarters)) == len(quarters), told

        # `llmgw events` prints them, newest first, and filters by kind.
        printed = subprocess.run(
            llmgw("events", "--model", "tiny", "--kind", "download", "--admin", server.admin),
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout.splitlines()  # fmt: skip
        assert len(printed) == len(told), printed
        assert printed[0].endswith(end["message"]), printed
        assert "  download  tiny  node-a  downloading " in printed[-1], printed
        everything = subprocess.run(
            llmgw("events", "--admin", server.admin),
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        assert "  ready  tiny  node-a  replica " in everything, everything


def test_llmgw_events_refuses_bad_input_and_an_unreachable_server_with_what_to_do(
    tmp_path: Path,
) -> None:
    refused = subprocess.run(
        llmgw("events", "--limit", "0", "--admin", "http://127.0.0.1:1"),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode == 2, refused
    assert "--limit" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    unreachable = subprocess.run(
        llmgw("events", "--admin", "http://127.0.0.1:1"),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert unreachable.returncode == 1, unreachable
    assert unreachable.stderr.startswith("error: cannot reach the admin API"), unreachable.stderr
    assert "Traceback" not in unreachable.stderr
