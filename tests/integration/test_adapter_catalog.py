"""LoRA adapters as catalog entries through a real `llmgw server` and the real CLI: one
declared in the config file, one added with `llmgw models add NAME --adapter-of BASE`,
both listed under their base, and the refusals an operator sees (an unknown base, a base
without adapter slots, serving flags on an adapter, removing a base that has adapters).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
from procs import Server, llmgw
from test_control_plane import fleet

MODELS = (
    "  - name: base\n    weights: none\n"
    "    profiles: [{name: sim, engine: sim, adapters: {max_loaded: 2, max_rank: 8}}]\n"
    "  - name: tone\n    adapter_of: base\n    weights: /srv/adapters/tone\n"
)

STORED_BASE = (
    "name: qwen\nweights: none\n"
    "profiles: [{name: sim, engine: sim, adapters: {max_loaded: 4, max_rank: 16}}]\n"
)


def cli(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        llmgw(*args, "--admin", server.admin),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_adapters_are_added_listed_under_their_base_and_guard_it(tmp_path: Path) -> None:
    with fleet(tmp_path, MODELS, nodes=0) as f:
        server = f.server
        added = cli(
            server, "models", "add", "sql", "--adapter-of", "base",
            "--weights", "/srv/adapters/sql", "--alias", "sql-v1",
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
        assert added.stdout.strip() == (
            "adapter sql of base added: it is kept in the server's store"
        )

        listing = cli(server, "models", "list")
        assert listing.returncode == 0, listing.stderr
        rows = [line.split() for line in listing.stdout.splitlines()]
        names = [row[0] for row in rows[1:]]
        assert names == ["base", "sql", "tone"]  # the adapters right under their base
        sql_row = next(line for line in listing.stdout.splitlines() if "sql" in line.split())
        assert "LoRA adapter of base" in sql_row and "sql-v1" in sql_row

        shown = cli(server, "models", "show", "base")
        assert shown.returncode == 0, shown.stderr
        assert "LoRA adapters of this model:" in shown.stdout
        assert "  sql: /srv/adapters/sql (aliases: sql-v1) [store]" in shown.stdout
        assert "  tone: /srv/adapters/tone [config]" in shown.stdout
        by_alias = cli(server, "models", "show", "sql-v1")
        assert by_alias.returncode == 0, by_alias.stderr
        assert "adapter:     sql (store)" in by_alias.stdout
        assert "base model:  base" in by_alias.stdout

        body = httpx.get(server.admin + "/admin/api/models", timeout=10).json()
        [base] = body["models"]
        assert [(a["name"], a["source"]) for a in base["adapters"]] == [
            ("sql", "store"),
            ("tone", "config"),
        ]
        # An adapter has no replicas of its own to place.
        placed = httpx.get(server.admin + "/admin/api/models/sql/placement", timeout=10)
        assert placed.status_code == 409
        assert placed.json()["error"]["code"] == "model_is_adapter"

        unknown = cli(server, "models", "add", "x", "--adapter-of", "nope", "--weights", "/x")
        assert unknown.returncode == 2
        assert "its base model 'nope' is not in the catalog" in unknown.stderr
        flags = cli(server, "models", "add", "x", "--adapter-of", "base", "--engine", "sim")
        assert flags.returncode == 2
        assert "give only NAME, --weights and --alias with it" in flags.stderr

        (tmp_path / "qwen.yaml").write_text(STORED_BASE)
        assert cli(server, "models", "add", "--file", str(tmp_path / "qwen.yaml")).returncode == 0
        made = cli(server, "models", "add", "q-lora", "--adapter-of", "qwen", "--weights", "/q")
        assert made.returncode == 0, made.stderr
        kept = cli(server, "models", "remove", "qwen")
        assert kept.returncode != 0
        assert "model 'qwen' is the base of the adapters 'q-lora'; remove them first" in (
            kept.stderr
        )
        assert cli(server, "models", "remove", "q-lora").returncode == 0
        gone = cli(server, "models", "remove", "qwen")
        assert gone.returncode == 0, gone.stderr
