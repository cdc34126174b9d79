"""RemoveWeights: only paths strictly inside the weights directory, symlinks followed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmgw.agent.errors import WeightsPathError
from llmgw.agent.weights import remove_path, resolve_removable


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    root = tmp_path / "weights"
    (root / "llama" / "shards").mkdir(parents=True)
    (root / "llama" / "shards" / "a.safetensors").write_bytes(b"a")
    (root / "gemma.gguf").write_bytes(b"g")
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "keep.txt").write_text("keep")
    return root


@pytest.mark.parametrize("path", ["../precious", "llama/../../precious", "..", ".", "", "llama/.."])
def test_refuses_escapes_and_the_root(weights: Path, path: str) -> None:
    with pytest.raises(WeightsPathError):
        resolve_removable(weights, path)
    assert (weights.parent / "precious" / "keep.txt").exists()


def test_refuses_absolute_paths_outside(weights: Path) -> None:
    outside = str(weights.parent / "precious")
    with pytest.raises(WeightsPathError, match="not inside the weights directory") as caught:
        resolve_removable(weights, outside)
    assert outside in str(caught.value)
    with pytest.raises(WeightsPathError):
        resolve_removable(weights, "/etc/passwd")


def test_refuses_symlinks_pointing_outside(weights: Path) -> None:
    os.symlink(weights.parent / "precious", weights / "link-dir")
    os.symlink(weights.parent / "precious" / "keep.txt", weights / "link-file")
    os.symlink(weights.parent, weights / "llama" / "up")
    for path in ("link-dir", "link-file", "llama/up/precious", "link-dir/keep.txt"):
        with pytest.raises(WeightsPathError, match="not inside"):
            resolve_removable(weights, path)
    assert (weights.parent / "precious" / "keep.txt").read_text() == "keep"


def test_a_weights_dir_behind_a_symlink_still_works(weights: Path, tmp_path: Path) -> None:
    alias = tmp_path / "alias"
    os.symlink(weights, alias)
    assert resolve_removable(alias, "gemma.gguf") == weights / "gemma.gguf"
    assert resolve_removable(alias, str(alias / "gemma.gguf")) == weights / "gemma.gguf"


def test_removes_a_file_and_a_tree_inside(weights: Path) -> None:
    assert remove_path(resolve_removable(weights, "gemma.gguf"))
    assert remove_path(resolve_removable(weights, str(weights / "llama")))
    assert sorted(p.name for p in weights.iterdir()) == []
    assert weights.is_dir()
    # Already gone: nothing to do, not an error.
    assert not remove_path(resolve_removable(weights, "gemma.gguf"))
