"""The agent's download progress: which files are in flight, and the line that says so.

The hub client writes each file it fetches into `blobs/<etag>[.<id>].incomplete`;
`_in_flight` maps those parts back to file names through the snapshot's file list.
"""

from __future__ import annotations

from pathlib import Path

from llmgw.agent.hub import Progress, _in_flight
from llmgw.config.hub import HubRef

NAMES = {
    "a" * 64: ("model-00001-of-00002.safetensors", 5_000_000_000),
    "b" * 64: ("model-00002-of-00002.safetensors", 4_000_000_000),
    "c" * 40: ("config.json", 700),
}


def test_parts_name_their_files_most_bytes_left_first(tmp_path: Path) -> None:
    (tmp_path / ("a" * 64 + ".1f2e3d4c.incomplete")).write_bytes(b"x" * 3000)
    (tmp_path / ("b" * 64 + ".incomplete")).write_bytes(b"x" * 10)
    (tmp_path / ("d" * 64 + ".incomplete")).write_bytes(b"x")  # not in the list: unnamed
    (tmp_path / ("c" * 40)).write_bytes(b"x" * 700)  # finished: not in flight
    assert _in_flight(tmp_path, NAMES) == (
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    )
    assert _in_flight(tmp_path / "missing", NAMES) == ()


def test_the_progress_line_names_the_file_being_fetched() -> None:
    ref = HubRef("org/name", "abc1234" + "0" * 33)
    one = Progress(done=6_232_000_000, total=15_200_000_000, rate=75_000_000.0,
                   files=("model-00002-of-00004.safetensors",))  # fmt: skip
    assert one.describe(ref) == (
        "downloading org/name@abc1234 41% of 15.2 GB, model-00002-of-00004.safetensors, 2 min left"
    )
    two = Progress(done=100, total=1000, rate=0.0, files=("a.safetensors", "b.safetensors"))
    assert (
        two.describe(ref) == "downloading org/name@abc1234 10% of 1.0 kB, a.safetensors and 1 more"
    )
    assert Progress(done=0, total=0, rate=0.0).describe(ref) == (
        "downloading org/name@abc1234 (listing its files)"
    )
