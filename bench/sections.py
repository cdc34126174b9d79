"""Rewriting one benchmark's section of bench/RESULTS.md between its markers."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def write_section(name: str, body: str) -> None:
    """Replace the text between `<!-- NAME:start -->` and `<!-- NAME:end -->`
    (appended at the end of the file when the markers are missing)."""
    begin, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = RESULTS.read_text() if RESULTS.exists() else ""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
    else:
        head, tail = text.rstrip("\n") + "\n\n", "\n"
    RESULTS.write_text(f"{head}{begin}\n{body.rstrip()}\n{end}{tail}")
