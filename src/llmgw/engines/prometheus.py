"""A small, forgiving reader of the Prometheus text exposition format.

Engines' `/metrics` pages are read for a handful of gauges. `parse_samples`
returns the samples of the wanted metric names; `metric_sum` and `metric_max`
fold one metric's samples across their label sets.

What it tolerates: comments, blank lines, timestamps, OpenMetrics exemplars and
`# EOF`, escaped quotes and commas inside label values, `NaN`/`+Inf` values.
Lines it cannot read are skipped; nothing here raises on any input text.

Not guaranteed: full format validation (a malformed page yields whatever
samples could be read, possibly none), UTF-8 quoted metric names (Prometheus 3;
such lines are skipped), or metric-type awareness (a sample is a name, labels
and a value; histograms are just more samples).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_VALUE = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[Ii]nf|NaN|nan)")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


@dataclass(frozen=True, slots=True)
class Sample:
    """One line of a metrics page: metric name, its labels and its value."""

    name: str
    labels: Mapping[str, str]
    value: float


def parse_samples(text: str, names: Collection[str] | None = None) -> list[Sample]:
    """The samples in `text`, in page order; only those named in `names` if given.

    Filtering by name first keeps large pages (vLLM's histograms run to
    thousands of lines) cheap: other lines are skipped before their labels are
    read.
    """
    samples: list[Sample] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _NAME.match(line)
        if match is None:
            continue
        name = match.group()
        if names is not None and name not in names:
            continue
        sample = _parse_rest(name, line, match.end())
        if sample is not None:
            samples.append(sample)
    return samples


def metric_sum(
    samples: Iterable[Sample], name: str, *, replica_labels: Collection[str] = ()
) -> float | None:
    """The sum of `name`'s finite samples across label sets; None when it has none.

    `replica_labels` names labels whose values tell apart copies of one quantity
    (ranks of one model-parallel group reporting the same batch): samples that
    differ only in those labels count once, by their largest value.
    """
    groups: dict[tuple[tuple[str, str], ...], float] = {}
    for sample in samples:
        if sample.name != name or not math.isfinite(sample.value):
            continue
        key = tuple(sorted((k, v) for k, v in sample.labels.items() if k not in replica_labels))
        previous = groups.get(key)
        groups[key] = sample.value if previous is None else max(previous, sample.value)
    if not groups:
        return None
    return math.fsum(groups.values())


def metric_max(samples: Iterable[Sample], name: str) -> float | None:
    """The largest finite sample of `name` across label sets; None when it has none."""
    values = [s.value for s in samples if s.name == name and math.isfinite(s.value)]
    return max(values) if values else None


def _parse_rest(name: str, line: str, pos: int) -> Sample | None:
    labels: dict[str, str] = {}
    if pos < len(line) and line[pos] == "{":
        parsed = _parse_labels(line, pos + 1)
        if parsed is None:
            return None
        labels, pos = parsed
    elif pos < len(line) and not line[pos].isspace():
        return None
    fields = line[pos:].split()
    if not fields or _VALUE.fullmatch(fields[0]) is None:
        return None
    return Sample(name=name, labels=labels, value=float(fields[0]))


def _parse_labels(line: str, pos: int) -> tuple[dict[str, str], int] | None:
    """Labels from just after `{` to just after `}`, or None when malformed."""
    labels: dict[str, str] = {}
    end = len(line)
    while True:
        pos = _skip_spaces(line, pos)
        if pos < end and line[pos] == "}":
            return labels, pos + 1
        match = _LABEL_NAME.match(line, pos)
        if match is None:
            return None
        pos = _skip_spaces(line, match.end())
        if not line.startswith("=", pos):
            return None
        pos = _skip_spaces(line, pos + 1)
        if pos >= end or line[pos] != '"':
            return None
        value = _read_quoted(line, pos + 1)
        if value is None:
            return None
        labels[match.group()], pos = value
        pos = _skip_spaces(line, pos)
        if pos < end and line[pos] == ",":
            pos += 1
        elif pos >= end or line[pos] != "}":
            return None


def _read_quoted(line: str, pos: int) -> tuple[str, int] | None:
    """The unescaped string from after an opening quote, and the index after its close."""
    chars: list[str] = []
    end = len(line)
    while pos < end:
        char = line[pos]
        if char == '"':
            return "".join(chars), pos + 1
        if char == "\\" and pos + 1 < end:
            following = line[pos + 1]
            chars.append(_ESCAPES.get(following, "\\" + following))
            pos += 2
            continue
        chars.append(char)
        pos += 1
    return None


def _skip_spaces(line: str, pos: int) -> int:
    while pos < len(line) and line[pos] in " \t":
        pos += 1
    return pos
