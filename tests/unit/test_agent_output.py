"""The engine output ring: bounded lines, \\r progress bars, long lines, split chunks."""

from __future__ import annotations

from llmgw.agent.output import OutputTail


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
