"""A case's figures: percentiles, and the rows of the report's table (one per measured sub-case)."""

from __future__ import annotations

import statistics
from typing import Any


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def p99(values: list[float]) -> float:
    return percentile(values, 0.99)


def paired_row(case: str, times: dict[str, list[float]]) -> dict[str, Any]:
    """Medians per variant; the ratio is the median of the per-round ratios (a stock and a
    fixed sample taken back to back), which cancels load that drifts between rounds."""
    stock, fixed = statistics.median(times["stock"]), statistics.median(times["fixed"])
    ratio = statistics.median(f / s for s, f in zip(times["stock"], times["fixed"]))
    return {
        "case": case,
        "stock_ms": stock * 1000,
        "fixed_ms": fixed * 1000,
        "ratio": ratio,
        "samples": len(times["stock"]),
    }


def pooled_row(case: str, stock: float, fixed: float, samples: int, **extra: Any) -> dict[str, Any]:
    """A row from pooled values (seconds): the ratio is fixed/stock of the pooled statistic."""
    return {
        "case": case,
        "stock_ms": stock * 1000,
        "fixed_ms": fixed * 1000,
        "ratio": fixed / stock if stock else float("nan"),
        "samples": samples,
        **extra,
    }


def ms_line(row: dict[str, Any]) -> str:
    return f"stock {row['stock_ms']:.2f} ms, fixed {row['fixed_ms']:.2f} ms, fixed/stock {row['ratio']:.2f}"
