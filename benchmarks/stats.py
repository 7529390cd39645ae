"""Medians, percentiles, number formatting and the text table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100) with linear interpolation between ranks."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


@dataclass(frozen=True)
class Summary:
    """Several runs of one metric: the median and the range."""

    median: float
    low: float
    high: float
    runs: tuple[float, ...]

    @staticmethod
    def of(values: Sequence[float]) -> Summary:
        return Summary(median(values), min(values), max(values), tuple(values))

    def as_json(self) -> dict[str, object]:
        return {"median": self.median, "min": self.low, "max": self.high, "runs": list(self.runs)}


def number(value: float) -> str:
    """Three significant digits, no exponent for the ranges we print."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1000 or (magnitude >= 1 and value == int(value)):
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    digits = 2 - math.floor(math.log10(magnitude))
    return f"{value:.{digits}f}"


def cell(summary: Summary | None) -> str:
    """`median (min-max)`, or just the value for a single run."""
    if summary is None:
        return "-"
    if len(summary.runs) == 1 or summary.low == summary.high:
        return number(summary.median)
    return f"{number(summary.median)} ({number(summary.low)}-{number(summary.high)})"


def render_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned text columns separated by two spaces, a rule under the header."""
    widths = [len(title) for title in header]
    for row in rows:
        for index, text in enumerate(row):
            widths[index] = max(widths[index], len(text))

    def line(items: Sequence[str]) -> str:
        return "  ".join(text.ljust(width) for text, width in zip(items, widths, strict=True))

    out = [line(header), "  ".join("-" * width for width in widths)]
    out.extend(line(row) for row in rows)
    return "\n".join(text.rstrip() for text in out)
