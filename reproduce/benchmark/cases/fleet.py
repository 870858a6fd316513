"""
``fleet``: 600 dataset-triggered DAGs on 60 datasets (single, ``&`` and ``|`` schedules), producers
committing 20 transactions a second with 1-3 outlets each in random order (seed printed), the real loop
taking Airflow's default 10 DAGs a pass: loop median and p90, producer p50 and p99, failed
transactions, lost and doubled after the drain.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from reproduce.benchmark.producers import producer_transaction
from reproduce.benchmark.rounds import (
    RoundsResult,
    TooFewSamples,
    count_findings,
    round_beside_a_scheduler,
    rounds_rows,
)
from reproduce.benchmark.runner import VARIANTS, Variants, in_rounds, log
from reproduce.benchmark.scheduler import drain, new_scheduler_runner
from reproduce.benchmark.world import analyze, make_consumers, quiet_other_dags, unpause_only

FLEET_DAGS_PER_DATASET = 10  # 600 DAGs on 60 datasets: an event queues about 20 of them


def bench_fleet(
    variants: Variants,
    dags: int,
    rate: int,
    rounds: int,
    round_seconds: float,
    seed: int,
    notes: list[str],
    producers: int = 4,
) -> list[dict[str, Any]]:
    """
    A fleet (issue 30: "nothing gets worse"): ``dags`` dataset-triggered DAGs on a tenth as many datasets,
    a third on one dataset, a third on two (``a & b``), a third on either of two (``a | b``),
    while producer processes commit ``rate`` transactions a second in all, each with one to three
    outlets in random order (``seed``), and a scheduler thread runs its real loop with
    Airflow's default ``max_dagruns_to_create_per_loop`` (10): more DAGs wait than a loop
    takes, as in a fleet. One copy of the fleet per variant (the other paused), one scheduler
    runner for the case (the net and the sweep read all the fleet's references, as in a
    scheduler that runs on), fresh statistics. Rounds alternate stock, fixed, fixed, stock;
    after each, one transaction with an event on every dataset (no DAG is left waiting for an
    AND partner) and a drain of the queue; then the invariant checker counts what was lost or
    doubled, and what no run consumed, per (event, consuming DAG): an event queues about 20.
    """
    from airflow.datasets import Dataset

    started = time.monotonic()
    copies: dict[str, tuple[list[Dataset], list[str]]] = {}
    count = max(2, dags // FLEET_DAGS_PER_DATASET)
    for variant in VARIANTS:
        datasets = [Dataset(f"bench://fleet/{variant}/{i:03d}") for i in range(count)]
        schedules = {}
        for i in range(dags):  # b is never a: an offset of 1 to count - 1
            a, b = datasets[i % count], datasets[(i + 1 + i // 3 % (count - 1)) % count]
            schedules[f"{i:04d}"] = [a] if i % 3 == 0 else (a & b) if i % 3 == 1 else (a | b)
        copies[variant] = (datasets, make_consumers(f"bench_fleet_{variant}", schedules))
    analyze()
    log(
        f"  {dags} DAGs per variant on {count} datasets ({time.monotonic() - started:.0f} s to write); "
        f"producers' seed {seed}"
    )
    quiet_other_dags([name for _, names in copies.values() for name in names])
    runner = new_scheduler_runner()
    since = datetime.now(timezone.utc) - timedelta(seconds=1)
    results = {v: RoundsResult() for v in VARIANTS}
    for i, variant in in_rounds(variants, rounds):
        datasets, names = copies[variant]
        unpause_only(names, [name for v, (_, dag_ids) in copies.items() if v != variant for name in dag_ids])
        _fleet_round(runner, datasets, names, rate, producers, round_seconds, results[variant], f"{seed}/{i}")
        # an event on every dataset, so that no DAG waits for an AND partner: the drain empties the queue
        if error := producer_transaction(list(datasets))[1]:
            results[variant].errors.append(f"closing producer: {error}")
        results[variant].errors += drain(runner, names, max_passes=dags // 5 + 20)
    label = f"fleet of {dags} DAGs, {rate} transactions/s"
    count_findings(label, results, {variant: names for variant, (_, names) in copies.items()}, since)
    try:
        return rounds_rows(label, rate, rounds * round_seconds, results, loop_target=1.1)
    except TooFewSamples as err:
        notes.append(str(err))
        return []


def _fleet_round(
    runner,
    datasets: list[Any],
    dag_ids: list[str],
    rate: int,
    producers: int,
    seconds: float,
    result: RoundsResult,
    seed: str,
) -> None:
    """One round of ``bench_fleet``: each producer process draws its outlets from a generator of its own."""
    import random

    def commit(n: int) -> Callable[[], tuple[float, str | None]]:
        rng = random.Random(f"{seed}/{n}")
        return lambda: producer_transaction(rng.sample(datasets, rng.randint(1, 3)))  # 1-3, in random order

    round_beside_a_scheduler(runner, dag_ids, rate, producers, seconds, result, commit=commit)
