"""
``busy-scheduler``: producer latency while the scheduler is busy. Producer threads commit events on a
dataset whose ten consumer DAGs a scheduler thread keeps creating runs for (its real loop,
``_create_dagruns_for_dags``, committing each pass); each producer transaction (register the event,
commit) is timed, and any failure is counted. Median and p99.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from reproduce.benchmark.figures import ms_line, p99
from reproduce.benchmark.producers import producer_transaction, run_beside_a_scheduler
from reproduce.benchmark.runner import VARIANTS, Variants, in_rounds, log
from reproduce.benchmark.scheduler import new_scheduler_runner, scheduler_pass
from reproduce.benchmark.world import make_consumers, quiet_other_dags


def bench_busy_producers(
    variants: Variants, rounds: int, producers: int = 4, commits: int = 30
) -> list[dict[str, Any]]:
    """Producer transaction latency (median, p99) while a scheduler thread creates runs for the same DAGs."""
    import threading

    from airflow import settings
    from airflow.datasets import Dataset

    dataset = Dataset("bench://busy/a")
    names = make_consumers("bench_busy", {f"c{i:02d}": [dataset] for i in range(10)})
    quiet_other_dags(names)
    latencies: dict[str, list[float]] = {v: [] for v in VARIANTS}
    failures: dict[str, int] = {v: 0 for v in VARIANTS}
    runner = new_scheduler_runner()

    def scheduler(stop: threading.Event, errors: list[str]) -> None:
        session = settings.Session.session_factory()
        while not stop.is_set():
            if error := scheduler_pass(runner, session):
                errors.append(f"scheduler: {error}")
        session.close()

    def producer(variant: str, seed: int, errors: list[str]) -> None:
        import random

        rng = random.Random(seed)
        for _ in range(commits):
            elapsed, error = producer_transaction(dataset)
            if error:
                failures[variant] += 1
                errors.append(f"producer: {error}")
            else:
                latencies[variant].append(elapsed)
            time.sleep(rng.uniform(0, 0.01))

    errors: list[str] = []
    for i, variant in in_rounds(variants, rounds):
        run_beside_a_scheduler(
            lambda stop: scheduler(stop, errors),
            [lambda seed=i * 100 + n: producer(variant, seed, errors) for n in range(producers)],
        )
    rows = []
    for name, pick in (("median", statistics.median), ("p99", p99)):
        stock, fixed = pick(latencies["stock"]), pick(latencies["fixed"])
        rows.append(
            {
                "case": f"producer beside a busy scheduler, {name}",
                "stock_ms": stock * 1000,
                "fixed_ms": fixed * 1000,
                "ratio": fixed / stock,
                "samples": len(latencies["stock"]),
                "failures": failures,
            }
        )
        log(f"  {rows[-1]['case']}: {ms_line(rows[-1])}")
    if errors:
        log(f"  {len(errors)} error(s) beside the busy scheduler, e.g. {errors[:3]}")
    return rows
