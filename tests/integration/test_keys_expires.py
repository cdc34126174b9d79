"""`llmgw keys create|update --expires` with durations in seconds, and bare numbers refused."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from procs import llmgw

from llmgw.cli.storeopts import BadInput, parse_time

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def run(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    return subprocess.run(
        [*llmgw(*args), "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


@pytest.mark.parametrize(
    ("text", "after"),
    [
        ("3600s", timedelta(seconds=3600)),
        ("45 sec", timedelta(seconds=45)),
        ("90m", timedelta(minutes=90)),
        ("12h", timedelta(hours=12)),
        ("7d", timedelta(days=7)),
        ("2w", timedelta(weeks=2)),
    ],
)
def test_durations_in_every_unit(text: str, after: timedelta) -> None:
    assert parse_time("--expires", text, now=NOW, future=True) == NOW + after
    assert parse_time("--since", text, now=NOW) == NOW - after


def test_a_bare_number_is_refused_naming_the_units() -> None:
    with pytest.raises(BadInput) as caught:
        parse_time("--expires", "3600", now=NOW, future=True)
    assert str(caught.value) == (
        "--expires '3600': a duration needs a unit: 3600s (seconds), 3600m, 3600h or 3600d "
        "from now; or give a date YYYY-MM-DD"
    )
    # Eight digits are a compact ISO date, not seconds.
    assert parse_time("--since", "20250301", now=NOW) == datetime(2025, 3, 1, tzinfo=UTC)


def test_the_cli_sets_an_expiry_in_seconds_and_refuses_a_bare_number(tmp_path: Path) -> None:
    before = datetime.now(UTC)
    created = run("keys", "create", "--name", "short", "--expires", "3600s", "--json",
                  data_dir=tmp_path)  # fmt: skip
    assert created.returncode == 0, created.stderr
    expires = datetime.fromisoformat(json.loads(created.stdout)["expires_at"])
    assert before + timedelta(seconds=3600) <= expires <= datetime.now(UTC) + timedelta(hours=1)

    updated = run("keys", "update", "short", "--expires", "120s", "--json", data_dir=tmp_path)
    assert updated.returncode == 0, updated.stderr
    expires = datetime.fromisoformat(json.loads(updated.stdout)["expires_at"])
    assert expires <= datetime.now(UTC) + timedelta(seconds=120)

    bare = run("keys", "update", "short", "--expires", "3600", data_dir=tmp_path)
    assert bare.returncode == 2
    assert bare.stderr.strip().splitlines() == [
        "error: --expires '3600': a duration needs a unit: 3600s (seconds), 3600m, 3600h or "
        "3600d from now; or give a date YYYY-MM-DD"
    ]
