"""
``first-run``: a DAG's first run over 50 000 and 200 000 events: the events of the last 800 s on its
dataset, 50 from each producer run (whose data intervals make the run's) and every tenth from none (the
REST API's), no run of the DAG yet, then one new event. One loop a sample, rolled back; the target is the
fixed loop's time, at most 1 s. The case fails unless both variants make the same run: run_id, logical
date, data interval and events.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from reproduce.benchmark.figures import ms_line, paired_row
from reproduce.benchmark.producers import commit_new_events
from reproduce.benchmark.runner import Variants, alternate, log
from reproduce.benchmark.scheduler import new_scheduler_runner, timed_loop
from reproduce.benchmark.world import analyze, make_consumers, quiet_other_dags


def bench_first_run(variants: Variants, sizes: tuple[int, ...], samples: int) -> list[dict[str, Any]]:
    """A DAG's first run over ``sizes`` events of the last 800 s (issue 49; the module's docstring)."""
    from airflow import settings
    from airflow.datasets import Dataset
    from airflow.models.dagrun import DagRun
    from airflow.models.dataset import DatasetEvent, DatasetModel, association_table
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType
    from sqlalchemy import insert, select

    def made(variant: str, session) -> None:  # the run each variant made: the same, or the case fails
        run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id))
        links = session.scalars(
            select(association_table.c.event_id).where(association_table.c.dag_run_id == run.id)
        )
        runs[variant] = (
            run.run_id,
            run.execution_date,
            run.data_interval_start,
            run.data_interval_end,
            sorted(links),
        )

    runner, rows = new_scheduler_runner(), []
    for size in sizes:
        dataset = Dataset(f"bench://first-run/{size}")
        (dag_id,) = make_consumers(f"bench_first_{size}", {"single": [dataset]})
        producer, end = f"bench_producer_{size}", datetime.now(timezone.utc) - timedelta(seconds=30)
        with settings.Session() as session:
            dataset_id = session.scalar(select(DatasetModel.id).where(DatasetModel.uri == dataset.uri))
            for start in range(0, size, 5_000):
                stamps = [
                    end - timedelta(seconds=800) * (size - i) / size
                    for i in range(start, min(size, start + 5_000))
                ]
                session.execute(
                    insert(DagRun),
                    [
                        {
                            "dag_id": producer,
                            "run_id": f"run_{start + i}",
                            "run_type": DagRunType.SCHEDULED,
                            "execution_date": stamp,
                            "state": DagRunState.SUCCESS,
                            "external_trigger": False,
                            "data_interval_start": stamp - timedelta(minutes=1),
                            "data_interval_end": stamp,
                            "clear_number": 0,
                        }
                        for i, stamp in enumerate(stamps)
                        if i % 50 == 0
                    ],
                )
                session.execute(
                    insert(DatasetEvent),
                    [
                        {
                            "dataset_id": dataset_id,
                            "timestamp": stamp,
                            "extra": {},
                            "source_map_index": -1,
                            "source_dag_id": None if i % 10 == 9 else producer,
                            "source_task_id": "emit",
                            "source_run_id": None if i % 10 == 9 else f"run_{start + i - i % 50}",
                        }
                        for i, stamp in enumerate(stamps)
                    ],
                )
            session.commit()
        analyze()
        quiet_other_dags([dag_id])
        commit_new_events(variants, [dataset])
        runs: dict[str, tuple] = {}
        times = alternate(variants, samples, timed_loop(runner, [dag_id], made=made), warmup=0, prime=False)
        row = paired_row(f"first run over {size} events", times)
        if runs["stock"] != runs["fixed"] or len(runs["fixed"][-1]) != size + 1:
            raise AssertionError(
                f"first run over {size} events: the fixed run differs from stock's: "
                f"{[r[:4] + (len(r[-1]),) for r in runs.values()]}"
            )
        log(f"  {row['case']}: {ms_line(row)}; the same run_id, dates and {size + 1} events in both")
        rows.append(row)
    return rows
