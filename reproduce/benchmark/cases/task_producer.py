"""``task-producer``: a real task with one dataset outlet, run by the task runner's own path."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any

from reproduce.benchmark.figures import ms_line, paired_row, percentile
from reproduce.benchmark.runner import Variants, alternate, log
from reproduce.benchmark.world import make_consumers


def bench_task_producer(variants: Variants, samples: int) -> list[dict[str, Any]]:
    """
    What a user feels of the producer path (issue 30): a real task with one dataset outlet,
    run from start to finish by the task runner's own path (``TaskInstance.run``: its state
    checks and writes, the task, the outlet's event and queue row, the COMMIT), one
    consuming DAG. Each sample is a new manual run of the producer DAG; stock and fixed
    alternate (ABBA). Two rows: the queue row exists (as on a busy dataset), and the queue row
    consumed before each run (deleted, untimed: a quiet dataset whose scheduler keeps up).
    """
    from airflow.datasets import Dataset
    from airflow.models.dag import DAG, DagModel
    from airflow.models.dataset import DatasetDagRunQueue
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.operators.python import PythonOperator
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType
    from sqlalchemy import delete, update

    dataset = Dataset("bench://task/out")
    (consumer,) = make_consumers("bench_task", {"consumer": [dataset]})
    dag = DAG(
        "bench_task_producer",
        schedule=None,
        start_date=datetime(2024, 1, 1, tzinfo=timezone.utc),
        catchup=False,
    )
    PythonOperator(task_id="emit", python_callable=lambda: None, outlets=[dataset], dag=dag)
    with create_session() as session:
        DAG.bulk_write_to_db([dag], session=session)
        SerializedDagModel.write_dag(dag, session=session)
        session.execute(update(DagModel).where(DagModel.dag_id == dag.dag_id).values(is_paused=False))
    base = datetime.now(timezone.utc) - timedelta(days=1)
    counter = iter(range(10**9))

    drained = False

    def measure(variant: str) -> float:
        n = next(counter)
        if drained:
            with create_session() as session:
                session.execute(
                    delete(DatasetDagRunQueue).where(DatasetDagRunQueue.target_dag_id == consumer)
                )
        logical_date = base + timedelta(seconds=n)
        run = dag.create_dagrun(
            run_id=f"bench_{n}",
            run_type=DagRunType.MANUAL,
            execution_date=logical_date,
            data_interval=(logical_date, logical_date),
            state=DagRunState.RUNNING,
            external_trigger=True,
        )
        ti = run.get_task_instance("emit")
        ti.task = dag.get_task("emit")
        started = time.perf_counter()
        ti.run(ignore_ti_state=True)
        elapsed = time.perf_counter() - started
        if ti.state != "success":
            raise AssertionError(f"{variant}: the task ended {ti.state}")
        return elapsed

    rows = []
    for drained, label in ((False, "queue row there"), (True, "queue row consumed before")):
        marks_before = _marks()
        times = alternate(variants, samples, measure, warmup=2, prime=False)
        marks = _marks() - marks_before  # the fixed host's evidence: one audit-log row an hour and verdict
        row = paired_row(
            f"a real task with one dataset outlet (TaskInstance.run), 1 consuming DAG, {label}; "
            f"{marks} marks for {len(times['fixed']) + 2} fixed tasks",
            times,
        )
        row["task_producer"] = {
            "p90_ratio": percentile(times["fixed"], 0.9) / percentile(times["stock"], 0.9)
        }
        log(f"  {row['case']}: {ms_line(row)}")
        rows.append(row)
    return rows


def _marks() -> int:
    from airflow.models.log import Log
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    from airflow_dataset_race_fix.evidence import MARK_EVENT

    with create_session() as session:
        return session.scalar(select(func.count()).select_from(Log).where(Log.event == MARK_EVENT))
