"""Small charts drawn as inline SVG on the server: no chart library, no script.

`line_chart` turns (x, value) points into polylines in a fixed 300 x 80 box
with a zero baseline, a rounded top value and labels for both ends of the time
axis; missing values (None) break the line. `share` gives a bar's length in
percent of the longest bar, for the usage page's top-N bars and the nodes'
memory bars (drawn as SVG rectangles, so the pages need no inline styles).

Not guaranteed: axes beyond the two ends, or readable output for more points
than the box is wide (a few hundred is the design).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

WIDTH = 300.0
HEIGHT = 80.0
# Room above and below the plot, so a line at zero or at the top is not cut in half.
PAD = 2.0


@dataclass(frozen=True, slots=True)
class LineChart:
    """What the chart macro draws; coordinates are in the 300 x 80 viewBox."""

    title: str
    segments: tuple[str, ...]
    dots: tuple[tuple[float, float], ...]
    top_label: str
    left_label: str
    right_label: str
    latest: str
    empty: bool
    width: float = WIDTH
    height: float = HEIGHT


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is at least `value`."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        if value <= step * power * (1 + 1e-9):
            return step * power
    return 10 * power


def line_chart(
    title: str,
    points: Sequence[tuple[float, float | None]],
    *,
    x_range: tuple[float, float],
    fmt: Callable[[float], str],
    left_label: str,
    right_label: str,
    empty_text: str = "no data yet",
    min_top: float = 1.0,
) -> LineChart:
    """Points as (x, value); x outside `x_range` is clipped to it. The value axis
    runs from 0 to a round number at or above the largest value and `min_top`
    (so a quiet hour of 0% errors does not read "max 100%")."""
    values = [v for _, v in points if v is not None]
    if not values:
        return LineChart(title, (), (), "", left_label, right_label, empty_text, True)
    top = nice_ceiling(max(*values, min_top))
    x0, x1 = x_range
    span = (x1 - x0) or 1.0

    def xy(x: float, v: float) -> tuple[float, float]:
        fx = min(1.0, max(0.0, (x - x0) / span))
        return round(fx * WIDTH, 1), round(HEIGHT - PAD - (v / top) * (HEIGHT - 2 * PAD), 1)

    segments: list[str] = []
    dots: list[tuple[float, float]] = []
    run: list[tuple[float, float]] = []
    for x, value in [*points, (x1, None)]:
        if value is not None:
            run.append(xy(x, value))
            continue
        if len(run) == 1:
            dots.append(run[0])
        elif run:
            segments.append(" ".join(f"{px},{py}" for px, py in run))
        run = []
    return LineChart(
        title=title,
        segments=tuple(segments),
        dots=tuple(dots),
        top_label=fmt(top),
        left_label=left_label,
        right_label=right_label,
        latest=fmt(values[-1]),
        empty=False,
    )


def share(value: float, largest: float) -> float:
    """`value` as a percentage of `largest` (0 to 100, one decimal)."""
    if largest <= 0 or value <= 0:
        return 0.0
    return round(min(100.0, 100.0 * value / largest), 1)
