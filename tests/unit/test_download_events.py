"""`DownloadWatch`: which shard reports make download events, and what they say."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from llmgw.control.inventory.model import Download, Shard, ShardState
from llmgw.control.reconciler.downloads import DownloadWatch

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
SHA = "abc1234" + "0" * 33


def download(done: int, total: int = 4_000_000_000, rate: float = 0.0) -> Download:
    return Download(
        repo="org/big",
        revision=SHA,
        done=done,
        total=total,
        rate=rate,
        files=("model-00002.safetensors", "model-00001.safetensors"),
        started=T0,
    )


def shard(
    shard_id: str,
    got: Download | None,
    state: ShardState = "starting",
    since: datetime = T0,
    message: str = "",
) -> Shard:
    return Shard(
        id=shard_id,
        model="big",
        engine="sim",
        state=state,
        message=message,
        pid=None,
        endpoint_url="",
        output_tail=(),
        exit_code=None,
        spec=None,
        since=since,
        download=got,
    )


def test_a_download_is_told_at_its_start_each_quarter_once_and_its_end() -> None:
    watch = DownloadWatch()
    told = watch.observe("n1", shard("r1", download(0, total=0)), T0)
    assert told == ["downloading org/big@abc1234 on node n1"]
    assert watch.observe("n1", shard("r1", download(100_000_000)), T0) == []
    told = watch.observe("n1", shard("r1", download(1_100_000_000, rate=20_000_000)), T0)
    assert told == [
        "org/big@abc1234 on node n1: 27% of 4.0 GB, 20.0 MB/s, 2 min left (model-00002.safetensors)"
    ]
    assert watch.observe("n1", shard("r1", download(1_200_000_000)), T0) == []
    # A jump past two quarters tells only the furthest.
    told = watch.observe("n1", shard("r1", download(3_100_000_000)), T0)
    assert [t.split(": ", 1)[1][:15] for t in told] == ["77% of 4.0 GB ("]
    end = watch.observe("n1", shard("r1", None, since=T0 + timedelta(seconds=200)), T0)
    assert end == ["downloaded org/big@abc1234 (4.0 GB) on node n1 in 3 min"]
    # Told once: later reports of the shard make no event.
    assert watch.observe("n1", shard("r1", None, "ready"), T0) == []


def test_two_shards_waiting_for_one_download_make_one_set_of_events() -> None:
    watch = DownloadWatch()
    assert len(watch.observe("n1", shard("r1", download(0)), T0)) == 1
    assert watch.observe("n1", shard("r2", download(0)), T0) == []
    assert len(watch.observe("n1", shard("r1", download(2_000_000_000)), T0)) == 1
    assert watch.observe("n1", shard("r2", download(2_000_000_000)), T0) == []
    # The same snapshot on another node is another download.
    assert watch.observe("n2", shard("r3", download(0)), T0) == [
        "downloading org/big@abc1234 (4.0 GB) on node n2"
    ]
    assert len(watch.observe("n1", shard("r1", None, "loading"), T0)) == 1
    assert watch.observe("n1", shard("r2", None, "loading"), T0) == []


def test_a_failed_download_says_how_far_it_got_and_why() -> None:
    watch = DownloadWatch()
    watch.observe("n1", shard("r1", download(1_000_000_000)), T0)
    end = watch.observe(
        "n1",
        shard(
            "r1",
            None,
            "failed",
            since=T0 + timedelta(seconds=30),
            message="downloading org/big@abc1234 failed: connection reset",
        ),
        T0,
    )
    assert end == [
        "download of org/big@abc1234 on node n1 ended at 25% of 4.0 GB after 30 s: "
        "downloading org/big@abc1234 failed: connection reset"
    ]


def test_a_removed_node_s_downloads_are_forgotten() -> None:
    watch = DownloadWatch()
    watch.observe("n1", shard("r1", download(0)), T0)
    watch.forget_node("n1")
    assert watch.observe("n1", shard("r1", None, "ready"), T0) == []
