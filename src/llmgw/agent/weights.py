"""Removing model weights, strictly inside the agent's weights directory.

A RemoveWeights path (relative to the weights directory, or absolute) is
resolved with every symlink followed; only something strictly inside the
resolved weights directory may be removed — never the directory itself, never
`..` escapes, never the target of a symlink that points elsewhere.

Not guaranteed: atomicity (a tree removal that fails half way leaves the rest),
or protection against another process swapping a path for a symlink between the
check and the removal; the weights directory is assumed to be the agent's own.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from llmgw.agent.errors import WeightsPathError


def resolve_removable(weights_dir: Path, path: str) -> Path:
    """The real path `path` names, if it lies strictly inside `weights_dir`."""
    if not path.strip():
        raise WeightsPathError("weights path is empty; name a file or directory to remove")
    if "\0" in path:
        raise WeightsPathError(f"weights path {path!r} contains a NUL byte")
    root = Path(os.path.realpath(weights_dir))
    candidate = Path(os.path.realpath(root / path))  # an absolute `path` replaces root
    if candidate == root or not candidate.is_relative_to(root):
        raise WeightsPathError(
            f"refusing to remove {path!r}: it resolves to {candidate}, which is not inside "
            f"the weights directory {root}; only paths inside it may be removed"
        )
    return candidate


def remove_path(path: Path) -> bool:
    """Remove a file or a directory tree (blocking; run it in a thread).

    Returns False when nothing was there. `path` must come from
    `resolve_removable`, so it is a real path, not a symlink.
    """
    try:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise WeightsPathError(f"cannot remove {path}: {exc.strerror or exc}") from exc
    return True
