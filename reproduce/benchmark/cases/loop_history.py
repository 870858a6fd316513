"""
``loop-history``: one ``SchedulerJobRunner._create_dagruns_for_dags`` pass that creates the runs of three
consumer DAGs (on ``a``, ``a & b``, ``a | b``) for one new event on each dataset, with 1 000 and then
100 000 historical events in the database. History is realistic: events spread over the past 7 days,
each consumed by a past run of every DAG scheduled on its dataset (runs of 10 events). The 1 000 case is
the newest 1 000 of the same timeline; older history is added for the 100 000 case, so the fixed loop's
ratio between the two sizes shows whether it scans history. ``--explain`` adds the event selection's
query plans.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

from reproduce.benchmark.figures import ms_line, paired_row
from reproduce.benchmark.producers import commit_new_events
from reproduce.benchmark.runner import Variants, alternate, log
from reproduce.benchmark.scheduler import new_scheduler_runner, timed_loop
from reproduce.benchmark.world import HISTORY_DAYS, add_history, analyze, make_consumers, quiet_other_dags


def _history_times(total: int, end: datetime) -> list[datetime]:
    """``total`` event instants evenly over HISTORY_DAYS days up to ``end``, oldest first."""
    step = timedelta(days=HISTORY_DAYS) / total
    return [end - step * (total - i) for i in range(total)]


def bench_loop(
    variants: Variants, sizes: tuple[int, ...], samples: int, explain: bool
) -> tuple[list[dict], list[str]]:
    from airflow import settings
    from airflow.datasets import Dataset, DatasetAll, DatasetAny
    from airflow.models.dataset import DatasetModel
    from sqlalchemy import select

    a, b = Dataset("bench://loop/a"), Dataset("bench://loop/b")
    names = make_consumers(
        "bench_loop", {"single_a": [a], "all_a_b": DatasetAll(a, b), "any_a_b": DatasetAny(a, b)}
    )
    dag_ids = dict(zip(("single_a", "all_a_b", "any_a_b"), names))
    quiet_other_dags(names)
    with settings.Session() as session:
        dataset_ids = dict(
            session.execute(
                select(DatasetModel.uri, DatasetModel.id).where(DatasetModel.uri.in_([a.uri, b.uri]))
            ).all()
        )
        dataset_ids = {"a": dataset_ids[a.uri], "b": dataset_ids[b.uri]}
    runner = new_scheduler_runner()

    end = datetime.now(timezone.utc) - timedelta(minutes=5)
    timeline = _history_times(max(sizes), end)
    rows, plans, loaded = [], [], 0
    for size in sorted(sizes):
        started = time.monotonic()
        older = timeline[len(timeline) - size : len(timeline) - loaded]  # grow history backwards
        add_history(dag_ids, dataset_ids, older, first_index=len(timeline) - size)
        loaded = size
        analyze()
        log(f"  history: {size} events ({time.monotonic() - started:.0f} s to load)")
        commit_new_events(variants, [a, b])
        times = alternate(variants, samples, timed_loop(runner, names))
        rows.append(paired_row(f"scheduler loop, {size} events", times))
        log(f"  {rows[-1]['case']}: {ms_line(rows[-1])}")
        if explain:
            plans += explain_event_queries(dag_ids["any_a_b"], dataset_ids, size)
    return rows, plans


def explain_event_queries(dag_id: str, dataset_ids: dict[str, int], size: int) -> list[str]:
    """Query plans of the event selection of stock and of the fix for one DAG."""
    from airflow import settings
    from airflow.models.dagrun import DagRun
    from airflow.models.dataset import DatasetEvent
    from airflow.utils.types import DagRunType
    from sqlalchemy import and_, func, select

    with settings.Session() as session:
        latest = session.scalar(
            select(func.max(DagRun.execution_date)).where(
                DagRun.dag_id == dag_id, DagRun.run_type == DagRunType.DATASET_TRIGGERED
            )
        )
        ids = sorted(dataset_ids.values())
        dialect = session.bind.dialect.name
        now = _ts(dialect, datetime.now(timezone.utc))
        floor = _ts(dialect, latest - timedelta(seconds=900))
        latest = _ts(dialect, latest)
        stock = select(DatasetEvent).where(
            DatasetEvent.dataset_id.in_(ids), DatasetEvent.timestamp <= now, DatasetEvent.timestamp > latest
        )
        fixed = select(DatasetEvent).where(
            DatasetEvent.dataset_id.in_(ids),
            ~DatasetEvent.created_dagruns.any(DagRun.dag_id == dag_id),
            DatasetEvent.timestamp >= floor,
        )
        # A run consumes events dated up to its logical date, so only runs dated >= floor can
        # have consumed an event above the floor: bounds the subquery to recent runs.
        suggested = select(DatasetEvent).where(
            DatasetEvent.dataset_id.in_(ids),
            ~DatasetEvent.created_dagruns.any(and_(DagRun.dag_id == dag_id, DagRun.execution_date >= floor)),
            DatasetEvent.timestamp >= floor,
        )
        latest_run = select(func.max(DagRun.execution_date)).where(
            DagRun.dag_id == dag_id, DagRun.run_type == DagRunType.DATASET_TRIGGERED
        )
        out = []
        cases = (
            ("stock events", stock),
            ("fixed events", fixed),
            ("suggested fixed events", suggested),
            ("fixed latest run", latest_run),
        )
        for name, stmt in cases:
            started = time.perf_counter()
            found = len(session.execute(stmt).all())
            elapsed = (time.perf_counter() - started) * 1000
            out.append(
                f"--- {size} events: {name} ({found} rows, {elapsed:.1f} ms)\n{_explain(session, stmt)}"
            )
    return out


def _ts(dialect: str, value: datetime):
    """A timestamp as SQL text (Airflow's UtcDateTime has no literal rendering for EXPLAIN)."""
    from sqlalchemy import literal_column

    value = value.astimezone(timezone.utc)
    if dialect == "postgresql":
        return literal_column(f"'{value.isoformat()}'::timestamptz")
    if dialect == "mysql":
        return literal_column(f"'{value.strftime('%Y-%m-%d %H:%M:%S.%f')}'")
    return literal_column(f"'{value.strftime('%Y-%m-%d %H:%M:%S.%f')}'")


def _explain(session, stmt) -> str:
    from sqlalchemy import text

    dialect = session.bind.dialect
    sql = str(stmt.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
    prefix = {"postgresql": "EXPLAIN ANALYZE ", "mysql": "EXPLAIN ", "sqlite": "EXPLAIN QUERY PLAN "}[
        dialect.name
    ]
    rows = session.execute(text(prefix + sql)).all()
    return "\n".join(" | ".join(str(c) for c in row) for row in rows)
