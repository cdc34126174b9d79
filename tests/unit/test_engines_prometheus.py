"""The Prometheus text reader: what it reads, what it skips, and that it never raises."""

from __future__ import annotations

import math
import random

import pytest

from llmgw.engines import Sample, metric_max, metric_sum, parse_samples


def test_reads_names_labels_values_and_skips_comments() -> None:
    text = (
        '# HELP up whether up\n# TYPE up gauge\n\nup 1\nreq{a="x",b="y"} 2.5e1\n   spaced   3   \n'
    )
    assert parse_samples(text) == [
        Sample(name="up", labels={}, value=1.0),
        Sample(name="req", labels={"a": "x", "b": "y"}, value=25.0),
        Sample(name="spaced", labels={}, value=3.0),
    ]


def test_label_values_with_escapes_commas_braces_and_spaces() -> None:
    text = 'm{path="C:\\\\dir",quote="say \\"hi\\"",nl="a\\nb",odd="x} ,y=\\"z",} 7 1712345678000\n'
    [sample] = parse_samples(text)
    assert sample.labels == {
        "path": "C:\\dir",
        "quote": 'say "hi"',
        "nl": "a\nb",
        "odd": 'x} ,y="z',
    }
    assert sample.value == 7.0


def test_openmetrics_exemplars_and_eof() -> None:
    text = 'c_total{a="1"} 4.0 # {trace_id="abc"} 1.0 1700000000.0\n# EOF\n'
    assert parse_samples(text) == [Sample(name="c_total", labels={"a": "1"}, value=4.0)]


def test_special_values() -> None:
    samples = parse_samples("a NaN\nb +Inf\nc -Inf\nd -0.5\ne .5\n")
    assert [s.name for s in samples] == ["a", "b", "c", "d", "e"]
    assert math.isnan(samples[0].value)
    assert samples[1].value == math.inf
    assert samples[3].value == -0.5
    assert samples[4].value == 0.5


@pytest.mark.parametrize(
    "line",
    [
        "no_value",
        'm{a="1"}',
        "m{a=1} 2",
        'm{a="1" 2',
        'm{a="unterminated} 2',
        'm{="x"} 2',
        'm{a="1"b="2"} 3',
        "m 1_000",
        "m 0x10",
        "m one",
        "9starts_with_digit 1",
        '{"utf8.name"} 1',
        "m{} ",
        "m{",
        "m\x00 1",
        "<html><body>Bad Gateway</body></html>",
    ],
)
def test_junk_lines_are_skipped(line: str) -> None:
    assert parse_samples(f"good 1\n{line}\nafter 2\n") == [
        Sample(name="good", labels={}, value=1.0),
        Sample(name="after", labels={}, value=2.0),
    ]


def test_empty_braces_and_name_filter() -> None:
    text = "a{} 1\nb 2\na_total 3\n"
    assert parse_samples(text, {"a"}) == [Sample(name="a", labels={}, value=1.0)]


def test_never_raises_on_random_text() -> None:
    rng = random.Random(1234)
    alphabet = 'ab:_{}=",\\ \n\t#.-+e0123456789NaInf\x00\u00e9'
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 80)))
        for sample in parse_samples(text):
            assert isinstance(sample.value, float)


def test_sum_and_max_across_label_sets() -> None:
    samples = parse_samples(
        'g{m="a"} 1\ng{m="b"} 2\ng{m="c"} NaN\ng{m="d"} +Inf\nh{m="a"} 0.25\nh{m="b"} 0.75\n'
    )
    assert metric_sum(samples, "g") == 3.0
    assert metric_max(samples, "h") == 0.75
    assert metric_sum(samples, "missing") is None
    assert metric_max(samples, "missing") is None
    assert metric_sum(parse_samples("g NaN\n"), "g") is None


def test_replica_labels_count_once_by_their_largest_value() -> None:
    samples = parse_samples(
        'g{dp="0",tp="0"} 4\ng{dp="0",tp="1"} 5\ng{dp="1",tp="0"} 2\ng{dp="1",tp="1"} 2\n'
    )
    assert metric_sum(samples, "g") == 13.0
    assert metric_sum(samples, "g", replica_labels={"tp"}) == 7.0
