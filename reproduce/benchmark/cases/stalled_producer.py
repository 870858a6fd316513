"""
``stalled-producer``: producer A stalls right before its COMMIT (after the fix's queue upsert and stamp)
while producer B commits on the same dataset and DAG every 0.5 s and producer C on another; B's and C's
p50, p99 and slowest transactions, B's commits and the failed transactions. Not on SQLite (one writer).
With default sizes it takes about 30 seconds.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from reproduce.benchmark.figures import ms_line, p99, pooled_row
from reproduce.benchmark.producers import producer_transaction
from reproduce.benchmark.runner import VARIANTS, Variants, in_rounds, log
from reproduce.benchmark.world import make_consumers, quiet_other_dags

STEADY_PRODUCER_PERIOD = 0.5  # seconds between the commits of producers B and C

STALLED_PRODUCER_SKIP = (
    "producer beside a stalled producer: skipped on sqlite (one writer: a stalled "
    "transaction holds the database's write lock, so every producer waits for it, stock "
    "and fixed alike)"
)


def bench_stalled_producer(variants: Variants, stall: float, rounds: int) -> list[dict[str, Any]]:
    """
    Producer A registers an event on dataset D (consumed by DAG X) and stalls for ``stall``
    seconds right before its COMMIT, after the fix's queue upsert and stamp, while producer B
    commits an event on D every 0.5 s and producer C does the same on another dataset and DAG.

    No scheduler runs, so the queue rows stay: A meets the row of (D, X) as it is on a busy
    dataset. Rounds alternate stock, fixed, fixed, stock, ...; each round runs B and C for a
    second before A starts and a second after A commits.
    """
    import threading

    from airflow.datasets import Dataset

    same, other = Dataset("bench://stalled/same"), Dataset("bench://stalled/other")
    names = make_consumers("bench_stalled", {"same": [same], "other": [other]})
    quiet_other_dags(names)
    for dataset in (same, other):  # the queue rows exist before the first round
        producer_transaction(dataset)
    latencies = {v: {"A": [], "B": [], "C": []} for v in VARIANTS}
    failed = {v: {"A": 0, "B": 0, "C": 0} for v in VARIANTS}
    errors: list[str] = []

    def record(variant: str, name: str, outcome: tuple[float, str | None]) -> None:
        elapsed, error = outcome
        if error:
            failed[variant][name] += 1
            errors.append(f"producer {name}: {error}")
        else:
            latencies[variant][name].append(elapsed)

    def steady(variant: str, name: str, dataset: Dataset, stop: threading.Event) -> None:
        while not stop.is_set():
            record(variant, name, producer_transaction(dataset))
            stop.wait(STEADY_PRODUCER_PERIOD)

    for _, variant in in_rounds(variants, rounds):
        stop = threading.Event()
        threads = [
            threading.Thread(target=steady, args=(variant, name, dataset, stop))
            for name, dataset in (("B", same), ("C", other))
        ]
        for thread in threads:
            thread.start()
        time.sleep(1)
        record(variant, "A", producer_transaction(same, before_commit=lambda session: time.sleep(stall)))
        time.sleep(1)
        stop.set()
        for thread in threads:
            thread.join()
    if errors:
        log(f"  {len(errors)} failed transaction(s) beside the stalled producer, e.g. {errors[:3]}")
    stock, fixed = latencies["stock"], latencies["fixed"]
    label = f"stalled producer ({stall:g} s)"
    summary = {
        "stall_seconds": stall,
        "b_commits": {v: len(latencies[v]["B"]) for v in VARIANTS},
        "failed": failed,
        "a_ms": {v: [t * 1000 for t in latencies[v]["A"]] for v in VARIANTS},
        "slowest_ms": {
            name: {v: max(latencies[v][name], default=0) * 1000 for v in VARIANTS} for name in ("B", "C")
        },
    }
    rows = []
    for name, what in (("B", "same dataset"), ("C", "other dataset")):
        if not stock[name] or not fixed[name]:
            continue
        for statistic, pick in (("p50", statistics.median), ("p99", p99), ("slowest", max)):
            rows.append(
                pooled_row(
                    f"{label}: {name}, {what}, {statistic}",
                    pick(stock[name]),
                    pick(fixed[name]),
                    len(stock[name]),
                )
            )
    if rows:
        rows[0]["stalled_producer"] = summary
    for row in rows:
        log(f"  {row['case']}: {ms_line(row)}")
    return rows
