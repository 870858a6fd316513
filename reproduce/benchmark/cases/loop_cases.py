"""
``loop-cases``: the scheduler loop with 50 000 and 200 000 events inside the look-back window (the last
ten minutes), all already consumed by past runs of the DAG (a busy mapped producer): what the
consumed-event check costs when the window is full; and the loop with 200 ready DAGs (one new event on
their dataset), cost per DAG.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from reproduce.benchmark.figures import ms_line, paired_row
from reproduce.benchmark.producers import commit_new_events
from reproduce.benchmark.runner import VARIANTS, Variants, alternate, log
from reproduce.benchmark.scheduler import new_scheduler_runner, timed_loop
from reproduce.benchmark.world import (
    add_consumed_events,
    analyze,
    evenly_before,
    id_of,
    make_consumers,
    quiet_other_dags,
)


def bench_loop_cases(
    variants: Variants, windows: tuple[int, ...], ready: int, samples: int
) -> list[dict[str, Any]]:
    """The loop with a full look-back window, and with many ready DAGs."""
    from airflow.datasets import Dataset

    runner = new_scheduler_runner()
    rows = []

    def case(
        name: str, dag_names: list[str], dataset: Dataset, per_loop: int = 10, prime: bool = True
    ) -> dict[str, Any]:
        quiet_other_dags(dag_names)
        commit_new_events(variants, [dataset])
        times = alternate(variants, samples, timed_loop(runner, dag_names, per_loop), warmup=1, prime=prime)
        row = paired_row(name, times)
        row["per_dag_ms"] = {v: row[f"{v}_ms"] / len(dag_names) for v in VARIANTS}
        log(f"  {row['case']}: {ms_line(row)}")
        return row

    for size in windows:  # events of the last ten minutes, all consumed by past runs
        dataset = Dataset(f"bench://window/{size}")
        (dag_id,) = make_consumers(f"bench_window_{size}", {"single_a": [dataset]})
        dataset_id = id_of(dataset)
        end = datetime.now(timezone.utc) - timedelta(seconds=30)
        add_consumed_events(dag_id, dataset_id, evenly_before(end, timedelta(minutes=10), size))
        analyze()
        rows.append(
            case(f"scheduler loop, {size} consumed events in the look-back window", [dag_id], dataset)
        )

    dataset = Dataset("bench://ready")
    names = make_consumers("bench_ready", {f"c{i:03d}": [dataset] for i in range(ready)})
    rows.append(case(f"scheduler loop, {ready} ready DAGs", names, dataset, per_loop=ready))
    return rows
