"""Every `llmgw ... --help`: it runs, has no stray " ." and shows each option's default."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from llmgw.cli.main import app


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(get_command(app)))


def _no_default(option: Any) -> bool:
    """An option without a default worth showing: none, an unset flag, an empty list."""
    if isinstance(option.show_default, str):
        return False
    default = option.default
    return default is None or default is False or default in ((), [])


@pytest.mark.parametrize(
    ("path", "command"), COMMANDS, ids=[" ".join(p) or "llmgw" for p, _ in COMMANDS]
)
def test_help_runs_without_artefacts_and_shows_defaults(
    path: tuple[str, ...], command: Any
) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    text = result.output
    assert "Usage: llmgw" in text
    # A help string's "[default: ...]" once vanished as rich markup, leaving " .".
    stray = [line for line in text.splitlines() if re.search(r"\s\.(\s|$)", line)]
    assert stray == [], f"llmgw {' '.join(path)} --help: {stray}"
    assert "[default: ]" not in text
    ctx = command.make_context("llmgw", [], resilient_parsing=True)
    for param in command.params:
        if param.param_type_name != "option" or param.name == "help" or param.hidden:
            continue
        if _no_default(param):
            continue
        record = param.get_help_record(ctx)
        assert record is not None, param.opts
        assert "default:" in record[1], f"llmgw {' '.join(path)} {param.opts[0]}: {record[1]}"
        # Click wraps lines at spaces and hyphens: compare without whitespace.
        assert "".join(record[1].split()) in "".join(text.split())


def test_a_help_text_default_written_in_brackets_is_shown() -> None:
    text = CliRunner().invoke(app, ["keys", "create", "--help"], env={"COLUMNS": "100"}).output
    flat = " ".join(text.split())
    assert "Requests per minute [default: unlimited]." in flat
    assert "--expires" in flat and "3600s, 12h or 90d [default: never]." in flat


def test_model_flags_whose_default_comes_from_the_server_name_it() -> None:
    text = CliRunner().invoke(app, ["models", "add", "--help"], env={"COLUMNS": "100"}).output
    flat = " ".join(text.split())
    for shown in (
        "GPUs per replica [default: 0].",
        "Replicas kept even when idle [default: 0].",
        "Most replicas under load [default: 1].",
        "-1 pins [default: 5m].",
        "up to --max-replicas [default: off].",
        "90s, 5m [default: 60s].",
    ):
        assert shown in flat, shown
