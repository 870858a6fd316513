"""The world the cases measure: consumer DAGs, historical events and runs, the planner's statistics."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

HISTORY_DAYS = 7
RUN_BATCH = 10  # events consumed per historical run


def make_consumers(prefix: str, schedules: dict[str, Any]) -> list[str]:
    from airflow.models.dag import DAG, DagModel
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.operators.empty import EmptyOperator
    from airflow.utils.session import create_session
    from sqlalchemy import update

    dags = []
    for name, schedule in schedules.items():
        dag = DAG(
            f"{prefix}_{name}",
            schedule=schedule,
            start_date=datetime(2024, 1, 1, tzinfo=timezone.utc),
            catchup=False,
            max_active_runs=100_000,
        )
        EmptyOperator(task_id="consume", dag=dag)
        dags.append(dag)
    with create_session() as session:
        DAG.bulk_write_to_db(dags, session=session)
        for dag in dags:
            SerializedDagModel.write_dag(dag, session=session)
        session.execute(
            update(DagModel).where(DagModel.dag_id.in_([d.dag_id for d in dags])).values(is_paused=False)
        )
    return [d.dag_id for d in dags]


def quiet_other_dags(keep: list[str]) -> None:
    """Only ``keep`` may take part in the loop: pause the rest and empty the queue."""
    from airflow.models.dag import DagModel
    from airflow.models.dataset import DatasetDagRunQueue
    from airflow.utils.session import create_session
    from sqlalchemy import delete, update

    with create_session() as session:
        session.execute(delete(DatasetDagRunQueue))
        session.execute(update(DagModel).where(DagModel.dag_id.not_in(keep)).values(is_paused=True))


def unpause_only(active: list[str], paused: list[str]) -> None:
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import update

    with create_session() as session:
        session.execute(update(DagModel).where(DagModel.dag_id.in_(paused)).values(is_paused=True))
        session.execute(update(DagModel).where(DagModel.dag_id.in_(active)).values(is_paused=False))


# the planner's statistics: none ever taken (issue 49: the run's first ANALYZE ends that state), taken before
# a case's bulk load ("behind") or after it ("fresh")
STATISTICS_STATES = ("never analyzed", "behind", "fresh")

ANALYZED: list[bool] = []  # the run's tables have had statistics taken


def analyze() -> None:
    """Refresh the planner's statistics after a bulk load, as autovacuum/auto-stats would."""
    from airflow import settings
    from sqlalchemy import text

    tables = ("dataset_event", "dag_run", "dagrun_dataset_event", "dataset_dag_run_queue")
    ANALYZED.append(True)
    with settings.engine.begin() as conn:
        dialect = conn.dialect.name
        if dialect == "mysql":
            conn.execute(text(f"ANALYZE TABLE {', '.join(tables)}"))
        elif dialect == "postgresql":
            for table in tables:
                conn.execute(text(f"ANALYZE {table}"))
        else:
            conn.execute(text("ANALYZE"))


LOOP_WATCHES = {"single_a": {"a"}, "all_a_b": {"a", "b"}, "any_a_b": {"a", "b"}}


def add_history(
    dag_ids: dict[str, str],
    dataset_ids: dict[str, int],
    instants: list[datetime],
    first_index: int,
    watches: dict[str, set[str]] = LOOP_WATCHES,
) -> None:
    """Events at ``instants`` (2 of 3 on a, 1 on b; all on a if there is no b), each consumed
    by a run of every DAG in ``watches`` whose datasets include the event's."""
    from airflow import settings
    from airflow.models.dagrun import DagRun
    from airflow.models.dataset import DatasetEvent, association_table
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType
    from sqlalchemy import insert, select

    chunk = 5_000
    for start in range(0, len(instants), chunk):
        part = instants[start : start + chunk]
        with settings.Session() as session:
            events = [
                {
                    "dataset_id": dataset_ids[
                        "b" if (first_index + start + i) % 3 == 2 and "b" in dataset_ids else "a"
                    ],
                    "timestamp": ts,
                    "extra": {},
                    "source_dag_id": "bench_history",
                    "source_task_id": "emit",
                    "source_run_id": "history",
                    "source_map_index": -1,
                }
                for i, ts in enumerate(part)
            ]
            session.execute(insert(DatasetEvent), events)
            stored = session.execute(
                select(DatasetEvent.id, DatasetEvent.dataset_id, DatasetEvent.timestamp)
                .where(
                    DatasetEvent.timestamp >= part[0],
                    DatasetEvent.timestamp <= part[-1],
                    DatasetEvent.source_dag_id == "bench_history",
                    DatasetEvent.dataset_id.in_(dataset_ids.values()),
                )
                .order_by(DatasetEvent.timestamp)
            ).all()
            by_dataset = {v: k for k, v in dataset_ids.items()}
            for name, dag_id in dag_ids.items():
                mine = [e for e in stored if by_dataset[e.dataset_id] in watches[name]]
                batches = [mine[i : i + RUN_BATCH] for i in range(0, len(mine), RUN_BATCH)]
                runs = [
                    {
                        "dag_id": dag_id,
                        "run_id": f"dataset_triggered__{b[-1].timestamp.isoformat()}_{b[-1].id}",
                        "execution_date": b[-1].timestamp + timedelta(milliseconds=1),
                        "state": DagRunState.SUCCESS,
                        "run_type": DagRunType.DATASET_TRIGGERED,
                        "external_trigger": False,
                        "data_interval_start": b[0].timestamp,
                        "data_interval_end": b[-1].timestamp,
                        "queued_at": b[-1].timestamp,
                        "start_date": b[-1].timestamp,
                        "end_date": b[-1].timestamp,
                        "clear_number": 0,
                    }
                    for b in batches
                ]
                # A run the scheduler made in an earlier round may hold one of these dates already.
                taken = set(
                    session.scalars(
                        select(DagRun.execution_date).where(
                            DagRun.dag_id == dag_id,
                            DagRun.execution_date >= part[0],
                            DagRun.execution_date <= part[-1] + timedelta(milliseconds=1),
                        )
                    )
                )
                for run in runs:
                    while run["execution_date"] in taken:
                        run["execution_date"] += timedelta(microseconds=1)
                    taken.add(run["execution_date"])
                session.execute(insert(DagRun), runs)
                run_ids = dict(
                    session.execute(
                        select(DagRun.run_id, DagRun.id).where(
                            DagRun.dag_id == dag_id, DagRun.run_id.in_([r["run_id"] for r in runs])
                        )
                    ).all()
                )
                links = [
                    {"dag_run_id": run_ids[run["run_id"]], "event_id": e.id}
                    for run, batch in zip(runs, batches)
                    for e in batch
                ]
                session.execute(insert(association_table), links)
            session.commit()


def id_of(dataset) -> int:
    """The id of ``dataset``'s row (``make_consumers`` wrote it)."""
    from airflow import settings
    from airflow.models.dataset import DatasetModel
    from sqlalchemy import select

    with settings.Session() as session:
        return session.scalar(select(DatasetModel.id).where(DatasetModel.uri == dataset.uri))


def evenly_before(end: datetime, span: timedelta, count: int) -> list[datetime]:
    """``count`` instants evenly over the ``span`` up to ``end``, oldest first."""
    return [end - span * (count - i) / count for i in range(count)]


def add_consumed_events(dag_id: str, dataset_id: int, instants: list[datetime]) -> None:
    """Events at ``instants`` on one dataset, each consumed by a run of its one DAG (``RUN_BATCH`` a run)."""
    add_history({"single_a": dag_id}, {"a": dataset_id}, instants, 0, watches={"single_a": {"a"}})


def event_rows(dataset_id: int, stamps: list[datetime], source_dag_id: str) -> list[dict[str, Any]]:
    """Rows of ``dataset_event``: an event at each of ``stamps``, from ``source_dag_id``'s history."""
    return [
        {
            "dataset_id": dataset_id,
            "timestamp": ts,
            "extra": {},
            "source_dag_id": source_dag_id,
            "source_task_id": "emit",
            "source_run_id": "history",
            "source_map_index": -1,
        }
        for ts in stamps
    ]


def consumed_run_row(dag_id: str, first: datetime, last: datetime) -> dict[str, Any]:
    """A row of ``dag_run``: a successful dataset-triggered run of ``dag_id`` over ``first`` to ``last``."""
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType

    return {
        "dag_id": dag_id,
        "run_id": f"dataset_triggered__{last.isoformat()}",
        "execution_date": last,
        "state": DagRunState.SUCCESS,
        "run_type": DagRunType.DATASET_TRIGGERED,
        "external_trigger": False,
        "data_interval_start": first,
        "data_interval_end": last,
        "queued_at": last,
        "start_date": last,
        "end_date": last,
        "clear_number": 0,
    }
