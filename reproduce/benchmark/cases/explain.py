"""``explain``: the ``explain`` command's time for one DAG over a long consumed history (not a ratio)."""

from __future__ import annotations

import statistics
import time
from datetime import datetime, timedelta, timezone

from reproduce.benchmark.runner import log
from reproduce.benchmark.world import ANALYZED, RUN_BATCH, add_history, id_of, make_consumers


def bench_explain(notes: list[str], events: int, samples: int = 3) -> None:
    """``explain`` for one DAG whose dataset has ``events`` events, all consumed by its runs (10 a run):
    its time, against the issue's bound of 1 s. Not a stock/fixed ratio: stock has no explain."""
    from airflow import settings
    from airflow.datasets import Dataset
    from sqlalchemy import text

    from airflow_dataset_race_fix.diagnostics.explain import explain

    dataset = Dataset("bench://explain/a")
    (dag_id,) = make_consumers("bench_explain", {"single_a": [dataset]})
    dataset_id = id_of(dataset)
    end = datetime.now(timezone.utc) - timedelta(hours=1)
    step = timedelta(days=7) / events
    add_history(
        {"single_a": dag_id}, {"a": dataset_id}, [end - (events - i) * step for i in range(events)], 0
    )
    # Fresh planner statistics, as autovacuum/InnoDB keep them on a live database: right after
    # a bulk load, PostgreSQL planned the audit's event query badly in one run out of three
    # (3.9 s instead of 0.3-0.5 s).
    ANALYZED.append(True)
    with settings.engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("ANALYZE dataset_event, dag_run, dagrun_dataset_event"))
        elif connection.dialect.name == "mysql":
            connection.execute(text("ANALYZE TABLE dataset_event, dag_run, dagrun_dataset_event"))
        connection.commit()
    from airflow_dataset_race_fix.diagnostics.explain import LoopSelection

    times, selection_times, dag_times = [], [], []
    for _ in range(samples):
        with settings.Session() as session:
            started = time.perf_counter()
            found = explain(session, dag_id)
            times.append(time.perf_counter() - started)
            session.rollback()
            started = time.perf_counter()
            loop = LoopSelection(session)
            selection_times.append(time.perf_counter() - started)
            started = time.perf_counter()
            explain(session, dag_id, loop=loop)
            dag_times.append(time.perf_counter() - started)
            session.rollback()
    median, selection, per_dag = (statistics.median(t) for t in (times, selection_times, dag_times))
    log(f"  explain: {median:.3f} s ({selection:.3f} s the loop's selection, {per_dag:.3f} s the DAG)")
    notes.append(
        f"explain, one DAG with {events // RUN_BATCH} runs over {events} events: median {median:.3f} s "
        f"of {samples} (verdict: {'runs' if found['verdict']['creates_run'] else 'waits'}): "
        f"{selection:.3f} s reading the next loop's selection as the scheduler does (it deserializes "
        f"every DAG with queue rows; read once for a page of DAGs), {per_dag:.3f} s the DAG itself; target "
        f"< 1 s: {'met' if median < 1 else 'MISSED'}"
    )
