"""Config-file hub weights are pinned when the file is read (`config_models`).

A resolver stand-in answers as the hub would: a commit and a size, a refusal, or
no answer. Refused is a config error naming the file and field; no answer leaves
the model as written at start, and keeps the earlier pin on a reload.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

import pytest

from llmgw.config import ServerConfig, load_server_config
from llmgw.config.hub import HubRef
from llmgw.control.catalog.hub import HubRefused, HubUnreachable, Resolved
from llmgw.control.catalog.reload import InvalidConfig, config_models

SHA = "a" * 40
OTHER = "b" * 40


class Hub:
    """Answers `commit` from `answers` by repo; records what it was asked."""

    def __init__(self, answers: dict[str, Resolved | Exception]) -> None:
        self.answers = answers
        self.asked: list[HubRef] = []

    async def commit(self, ref: HubRef) -> Resolved:
        self.asked.append(ref)
        answer = self.answers[ref.repo]
        if isinstance(answer, Exception):
            raise answer
        return answer


def read(tmp_path: Path, *weights: str) -> tuple[str, ServerConfig]:
    path = tmp_path / "llmgw.yaml"
    path.write_text(
        "models:\n"
        + "".join(
            f"  - name: m{i}\n    weights: {w}\n    profiles: [{{name: p, engine: sim}}]\n"
            for i, w in enumerate(weights)
        )
    )
    return str(path), load_server_config(path, {})


def test_hub_weights_are_pinned_with_their_size_and_others_left_alone(tmp_path: Path) -> None:
    label, cfg = read(tmp_path, "org/a", "none", f"org/b@{OTHER}")
    hub = Hub({"org/a": Resolved(SHA, 123), "org/b": Resolved(OTHER, 456)})
    models = asyncio.run(config_models(cfg, label=label, revisions=hub))
    assert [(m.weights_commit, m.weights_bytes) for m in models] == [
        (SHA, 123),
        (None, None),
        (OTHER, 456),
    ]
    assert models[0].launch_weights == f"org/a@{SHA}"
    assert sorted(str(r) for r in hub.asked) == sorted(["org/a@main", f"org/b@{OTHER}"])


def test_a_refused_repo_names_the_file_and_field(tmp_path: Path) -> None:
    label, cfg = read(tmp_path, "none", "org/nope@v2")
    hub = Hub({"org/nope": HubRefused("Repository not found (404)")})
    with pytest.raises(InvalidConfig) as caught:
        asyncio.run(config_models(cfg, label=label, revisions=hub))
    assert caught.value.message == (
        f"{label}: models[1].weights: model 'm1', field 'weights': the hub refused 'org/nope' "
        "at revision 'v2': Repository not found (404); give an existing repo and revision "
        "(and HF_TOKEN on the server for a private one)"
    )


def test_an_unreachable_hub_leaves_it_as_written_or_as_pinned_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    label, cfg = read(tmp_path, "org/a")
    hub = Hub({"org/a": HubUnreachable("cannot reach the hub at http://hub: refused")})
    with caplog.at_level(logging.WARNING):
        [model] = asyncio.run(config_models(cfg, label=label, revisions=hub))
    assert model.weights_commit is None
    assert f"{label}: models[0].weights: model 'm0': cannot resolve org/a@main" in caplog.text
    # On a reload, the model in force keeps its commit: a hub outage rolls nothing.
    earlier = dataclasses.replace(model, weights_commit=SHA, weights_bytes=9)
    [kept] = asyncio.run(config_models(cfg, label=label, revisions=hub, earlier={"m0": earlier}))
    assert (kept.weights_commit, kept.weights_bytes) == (SHA, 9)
