"""Small helpers shared by the benchmarks: percentiles and a uniform report line."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def pct(values: list[float], q: float) -> float:
    """Return the q-th percentile (0..100) of values, nearest-rank."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))
    return ordered[index]


def median(values: list[float]) -> float:
    """Return the median."""
    return statistics.median(values)


def report(name: str, value: float, unit: str, target: str = "") -> None:
    """Print one figure as an aligned line."""
    suffix = f"   (target {target})" if target else ""
    print(f"{name:<58} {value:>12,.3f} {unit}{suffix}")


def per_call(fn: Callable[[], object], calls: int) -> float:
    """Return the mean time of one call of fn over ``calls`` calls, in seconds."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls
