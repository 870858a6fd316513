"""
Statement sizes at scale, on every backend: 10 000 queue rows for one DAG, one dataset with
10 000 consuming DAGs, and a first run over 25 000 events. Every statement of the fix whose
size follows the number of rows, datasets or DAGs is chunked, so it stays inside SQLite's
expression depth (1 000) and bound variables (999 before 3.32), and MySQL's packet size. The
previous fix crashed the scheduler here on SQLite ("Expression tree is too large").
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

from airflow import settings
from airflow.datasets import DatasetAny
from airflow.models.dag import DagModel
from airflow.models.dagrun import DagRun
from airflow.models.dataset import (
    DagScheduleDatasetReference,
    DatasetDagRunQueue,
    DatasetEvent,
    DatasetModel,
    association_table,
)
from airflow.models.serialized_dag import SerializedDagModel
from airflow.utils.session import create_session
from airflow.utils.state import DagRunState
from airflow.utils.types import DagRunType
from matrix import ON_MAIN_RELEASE_ONLY
from sqlalchemy import event, func, insert, select, update

from airflow_dataset_race_fix.diagnostics import invariant
from reproduce.harness.world import DONE, World

pytestmark = ON_MAIN_RELEASE_ONLY

MANY = 10_000
# A loop over 10 000 rows spends most of its time in stock Airflow's own per-row lazy loads
# (``dags_needing_dagruns`` reads each queue row's dataset, ``data_interval_for_events`` each
# event's source run): 20 000 round trips, about 20 s on MariaDB alone and past the harness's
# 60 s with two tox envs sharing two cores. A lock wait would still show as BLOCKED at once.
LOOP_TIMEOUT = 600.0


def _count(model, *where) -> int:
    with create_session() as session:
        return session.scalar(select(func.count()).select_from(model).where(*where))


def test_one_dag_with_ten_thousand_queued_rows(variant_fixed):
    w = World("rows10k", step_timeout=LOOP_TIMEOUT)
    try:
        a, b = w.dataset("a"), w.dataset("b")
        dag_id = w.consumer("d", DatasetAny(a, b), max_active_runs=1)
        p, s = w.producer("P"), w.scheduler()
        start = w.clock.at(1)
        # The DAG is scheduled on 10 000 more datasets (as an OR schedule on them would make
        # it), each with an event and a queue row: what piles up while it is held back.
        with create_session() as session:
            models = [DatasetModel(uri=f"race://{w.prefix}/many/{i}") for i in range(MANY)]
            session.add_all(models)
            session.flush()
            session.add_all(DagScheduleDatasetReference(dag_id=dag_id, dataset_id=m.id) for m in models)
            session.add_all(
                DatasetEvent(dataset_id=m.id, timestamp=start - timedelta(seconds=i % 500))
                for i, m in enumerate(models)
            )
            session.add_all(
                DatasetDagRunQueue(dataset_id=m.id, target_dag_id=dag_id, created_at=start) for m in models
            )
        w.clock.at(2), w.emit(p, a), p.finish()
        w.clock.at(3)
        assert w.loop(s) == DONE
        s.finish()  # raises what the loop raised
        with create_session() as session:
            run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id))
            assert len(run.consumed_dataset_events) == MANY + 1
        assert _count(DatasetDagRunQueue, DatasetDagRunQueue.target_dag_id == dag_id) == 0
        assert w.report().violations() == {}
    finally:
        w.close()


def test_one_dataset_with_ten_thousand_consuming_dags(variant_fixed):
    w = World("dags10k", step_timeout=LOOP_TIMEOUT)
    try:
        a = w.dataset("a")
        dag_ids = w.consumers("c", [a], MANY)
        p, s = w.producer("P"), w.scheduler()
        w.clock.at(1)
        assert w.emit(p, a) == DONE  # one producer transaction queues all 10 000 DAGs
        p.finish()
        assert _count(DatasetDagRunQueue, DatasetDagRunQueue.target_dag_id.like(f"{w.prefix}_c%")) == MANY
        # One scheduler loop over 1 000 of them (the others paused): 1 000 runs, chunked statements.
        ready, held = dag_ids[:1000], dag_ids[1000:]
        with create_session() as session:
            session.execute(
                update(DagModel)
                .where(DagModel.dag_id >= held[0], DagModel.dag_id.like(f"{w.prefix}_c%"))
                .values(is_paused=True)
                .execution_options(synchronize_session=False)
            )
        per_loop = DagModel.NUM_DAGS_PER_DAGRUN_QUERY
        DagModel.NUM_DAGS_PER_DAGRUN_QUERY = len(ready)
        try:
            w.clock.at(2)
            assert w.loop(s) == DONE
            s.finish()
        finally:
            DagModel.NUM_DAGS_PER_DAGRUN_QUERY = per_loop
        assert _count(DagRun, DagRun.dag_id.like(f"{w.prefix}_c%")) == len(ready)
        assert _count(DatasetDagRunQueue, DatasetDagRunQueue.target_dag_id.like(f"{w.prefix}_c%")) == len(
            held
        )
        with create_session() as session:
            report = invariant.check(session, ready + held[:100])
        assert report.violations() == {}
        assert report.total("consumed") == len(ready)
    finally:
        w.close()


BULK = 25_000  # three link statements of at most 10 000 rows


def test_a_first_run_over_many_events_takes_each_in_few_statements_as_airflow_dates_them(variant_fixed):
    """
    A new DAG's first run over 25 001 events (issue 49): each consumed once, its data interval and run_id
    those of Airflow's own functions over the same events, in a bounded number of statements (Airflow's path
    read each event's producer run: a statement an event) with the links at most 10 000 rows a statement.
    """
    w = World("bulkrun", step_timeout=LOOP_TIMEOUT)
    try:
        a = w.dataset("a")
        dag_id = w.consumer("d", a)
        p, s = w.producer("P"), w.scheduler()
        start = w.clock.at(1)
        producer = f"{w.prefix}_producer"
        # Producer runs whose intervals reach beyond the events' stamps; a run of another DAG with the same
        # run_id and a wider interval (matched on both keys, or the interval is wrong); events of a run that
        # is gone and events with no producer (the REST API's), dated by their own stamps.
        with create_session() as session:
            session.execute(
                insert(DagRun),
                [
                    {
                        "dag_id": dag,
                        "run_id": f"run_{i}",
                        "run_type": DagRunType.MANUAL,
                        "state": DagRunState.SUCCESS,
                        "execution_date": start - timedelta(hours=i + 1, days=days),
                        "external_trigger": True,
                        "data_interval_start": start - timedelta(hours=i + 2, days=days),
                        "data_interval_end": start
                        - timedelta(hours=i + 1, days=days)
                        - timedelta(minutes=hours_later),
                    }
                    for dag, days, hours_later in ((producer, 0, 0), (f"{w.prefix}_other", 3, -600))
                    for i in range(20)
                ],
            )
            dataset_id = session.scalar(select(DatasetModel.id).where(DatasetModel.uri == a.uri))
            sources = [(None, None), (producer, "gone")] + [(producer, f"run_{i}") for i in range(20)]
            session.execute(
                insert(DatasetEvent),
                [
                    {
                        "dataset_id": dataset_id,
                        "timestamp": start - timedelta(seconds=800 * (BULK - i) / BULK),
                        "extra": {},
                        "source_dag_id": sources[i % len(sources)][0],
                        "source_run_id": sources[i % len(sources)][1],
                    }
                    for i in range(BULK)
                ],
            )
        w.clock.at(2), w.emit(p, a), p.finish()
        w.clock.at(3)
        statements: list[str] = []

        def record(conn, cursor, statement, parameters, context, executemany):
            # the scheduler's, not the lock monitor's
            if threading.current_thread().name == f"actor-{s.name}":
                statements.append(statement)

        event.listen(settings.engine, "before_cursor_execute", record)
        try:
            assert w.loop(s) == DONE
            s.finish()
        finally:
            event.remove(settings.engine, "before_cursor_execute", record)
        links = [
            text
            for text in statements
            if text.lstrip().upper().startswith("INSERT INTO DAGRUN_DATASET_EVENT")
        ]
        assert len(statements) < 100, Counter(text[:100] for text in statements).most_common(
            3
        )  # Airflow: 25 000+
        assert len(links) == 3 and max(text.count("(") for text in links) == 10_000 + 1, len(links)
        with create_session() as session:
            run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id))
            linked = session.scalars(
                select(association_table.c.event_id).where(association_table.c.dag_run_id == run.id)
            )
            events = session.scalars(select(DatasetEvent).where(DatasetEvent.dataset_id == dataset_id)).all()
            assert sorted(linked) == sorted(e.id for e in events) and len(events) == BULK + 1
            dag = SerializedDagModel.get_dag(dag_id, session=session)
            expected = dag.timetable.data_interval_for_events(run.execution_date, events)
            assert (run.data_interval_start, run.data_interval_end) == tuple(expected)
            assert expected.start == start - timedelta(hours=21) and expected.end == max(
                e.timestamp for e in events
            )
            assert run.run_id == dag.timetable.generate_run_id(
                run_type=DagRunType.DATASET_TRIGGERED,
                logical_date=run.execution_date,
                data_interval=expected,
                events=events,
            )
        assert w.report().violations() == {}
    finally:
        w.close()
