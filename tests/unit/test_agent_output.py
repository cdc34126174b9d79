"""The engine output ring: bounded lines, \\r progress bars, long lines, split chunks;
and the follower of an engine's log file (appends, rotation, an adopted engine's tail)."""

from __future__ import annotations

from pathlib import Path

from llmgw.agent.output import LogFollower, OutputTail


def test_keeps_only_the_last_lines() -> None:
    tail = OutputTail(max_lines=3)
    tail.feed(b"".join(f"line {i}\n".encode() for i in range(10)))
    assert tail.lines() == ("line 7", "line 8", "line 9")


def test_lines_split_across_chunks_and_carriage_returns() -> None:
    tail = OutputTail()
    assert tail.feed(b"Loading 10%\rLoading 50%\rLoad") == ["Loading 10%", "Loading 50%"]
    assert tail.feed(b"ed\r\nready\r") == ["Loaded", "ready"]
    assert tail.feed(b"\nerror: no such option --x") == []
    assert tail.close() == ["error: no such option --x"]
    assert tail.lines() == (
        "Loading 10%",
        "Loading 50%",
        "Loaded",
        "ready",
        "error: no such option --x",
    )


def test_long_lines_and_bad_bytes_are_cut_and_replaced() -> None:
    tail = OutputTail(max_line_chars=10)
    tail.feed(b"x" * 100 + b"\n\xff\xfe ok\n")
    assert tail.lines() == ("x" * 10 + " …", "\ufffd\ufffd ok")
    # An endless line without a break does not grow memory without bound.
    for _ in range(100):
        tail.feed(b"y" * 1000)
    assert len(tail.close()[0]) <= 12


def test_blank_lines_are_dropped() -> None:
    tail = OutputTail()
    tail.feed(b"\n\n  \nreal\n\n")
    assert tail.lines() == ("real",)


def test_the_log_follower_reads_appends_and_rotates(tmp_path: Path) -> None:
    log = tmp_path / "shard.log"
    tail = OutputTail(max_lines=10)
    follower = LogFollower(log, tail, max_bytes=4096)
    assert follower.read() == []  # no file yet
    with log.open("ab") as engine:
        engine.write(b"loading\nhalf a li")
        engine.flush()
        assert follower.read() == ["loading"]
        engine.write(b"ne\n" + b"x" * 5000 + b"\n")
        engine.flush()
        assert follower.read()[0] == "half a line"
        # Over max_bytes: copied to .1 and cut; the engine's next append lands at 0.
        assert log.stat().st_size == 0
        assert (tmp_path / "shard.log.1").read_bytes().startswith(b"loading\n")
        engine.write(b"after the cut\n")
        engine.flush()
        assert follower.read() == ["after the cut"]


def test_an_adopted_engine_s_tail_starts_near_the_end_at_a_line(tmp_path: Path) -> None:
    log = tmp_path / "shard.log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(20000)))
    tail = OutputTail(max_lines=5)
    follower = LogFollower(log, tail, max_bytes=10**9)
    follower.start_at_end(keep=100)
    follower.read()
    assert tail.lines() == tuple(f"line {i}" for i in range(19995, 20000))


def test_the_follower_skips_to_the_last_mebibyte_of_a_flood(tmp_path: Path) -> None:
    log = tmp_path / "shard.log"
    tail = OutputTail(max_lines=3)
    follower = LogFollower(log, tail, max_bytes=10**9)
    log.write_bytes(b"".join(b"line %07d\n" % i for i in range(300000)) + b"the end\n")
    lines = follower.read()
    assert len(lines) < 100000  # about 1 MiB's worth, not all 3.6 MB
    assert tail.lines() == ("line 0299998", "line 0299999", "the end")
    assert all(line.startswith(("line ", "the end")) for line in lines)
