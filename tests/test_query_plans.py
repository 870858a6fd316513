"""
The plans that the scheduler's cost rests on, read with EXPLAIN on the server, not timed.

1. The consumed-event check. A dataset fed tens of events a second leaves thousands of consumed events within
``commit_latency_seconds`` of the newest one, and each loop checks them against what the
DAG consumed (the floor, BUG_REPORT section 6). That check must cost what the runs since the
floor hold, never what the association table holds: PostgreSQL hashed the whole
``dagrun_dataset_event`` table for it once one DAG's consumption filled the table (10 ms of
a 50 ms loop at 50 000 rows), until the runs were joined to their events LATERAL.

2. The queue delete at the end of the loop. Its locking select must run once per statement
whatever the statistics say: as an ``IN`` subquery, statistics taken on a near-empty queue
let the planner put it on the inner side of a nested loop, rescanned for every queue row
(more than 11 minutes for 10 000 rows, in this test suite).

3. The sweep, under the same statistics: one index probe per (dataset, DAG) reference into
the queue, the events and the runs, never a scan of them per reference.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from datetime import timedelta
from typing import Callable, Iterator

import pytest
from airflow import settings
from airflow.models.dag import DagModel
from airflow.models.dataset import DatasetDagRunQueue, DatasetModel
from airflow.utils.session import create_session
from conftest import BACKEND
from matrix import ON_MAIN_RELEASE_ONLY
from sqlalchemy import event, select, text

from reproduce.benchmark.world import add_history
from reproduce.harness.world import DONE, World

pytestmark = [
    ON_MAIN_RELEASE_ONLY,
    pytest.mark.skipif(BACKEND != "postgres", reason="PostgreSQL's plan of the consumed-event check"),
]

CONSUMED = 20_000  # events over the last ten minutes, ten to a run: 2 000 runs


@pytest.fixture
def world(request, variant_fixed):
    w = World(request.node.name[:20])
    yield w
    w.close()


@contextmanager
def explained(wanted: Callable[[str], bool], run: bool = False) -> Iterator[list[str]]:
    """The plans (``EXPLAIN`` text; ``run``: ``EXPLAIN ANALYZE``, for SELECTs) of the statements ``wanted``
    picks, sent while inside."""
    plans: list[str] = []

    def explain(conn, cursor, statement, parameters, context, executemany):
        if wanted(statement):
            cursor.execute(("EXPLAIN ANALYZE " if run else "EXPLAIN ") + statement, parameters)
            plans.append("\n".join(row[0] for row in cursor.fetchall()))

    event.listen(settings.engine, "before_cursor_execute", explain)
    try:
        yield plans
    finally:
        event.remove(settings.engine, "before_cursor_execute", explain)


def nested_loops_only(session) -> None:
    """Leave the planner no join but the nested loop (for this transaction): the plan that
    statistics taken on a near-empty table choose, made certain."""
    for setting in ("enable_hashagg", "enable_hashjoin", "enable_mergejoin", "enable_material"):
        session.execute(text(f"SET LOCAL {setting} = off"))


def test_the_consumed_event_check_reads_the_runs_since_the_floor_not_the_association_table(world):
    w = world
    a, _ = busy_dag(w)
    # Fresh statistics for the tables this plan reads, as autovacuum keeps them (the queue's
    # near-empty statistics are the next test's case).
    analyze()
    producer, scheduler = w.producer("p"), w.scheduler()
    assert w.emit(producer, a) == DONE

    with explained(
        lambda statement: statement.lstrip().startswith("SELECT dataset_event.id") and "NOT IN" in statement
    ) as plans:
        assert w.loop(scheduler) == DONE
    assert plans, "the loop sent no consumed-event check"
    for plan in plans:
        assert "Seq Scan on dagrun_dataset_event" not in plan, plan
        assert "on dagrun_dataset_event" in plan and "Index" in plan, plan


QUEUED = 2_000


def test_the_queue_delete_locks_once_and_deletes_by_address_whatever_the_statistics(world):
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner

    w = world
    dag_id = w.consumer("d", [w.dataset("a")])
    ids = datasets(w, QUEUED)

    def queue(dataset_ids):
        queue_rows(w, dataset_ids, [dag_id])

    # Statistics from a near-empty queue (autovacuum may take them so), then the queue fills.
    delete_all = text("DELETE FROM dataset_dag_run_queue")
    queue(ids[:5])
    with settings.engine.begin() as conn:
        conn.execute(text("ANALYZE dataset_dag_run_queue"))
        conn.execute(delete_all)
    queue(ids)

    def the_delete(statement: str) -> bool:
        return (
            statement.lstrip().upper().startswith("DELETE FROM DATASET_DAG_RUN_QUEUE")
            and "LOCKED" in statement.upper()
        )

    with explained(the_delete) as plans, create_session() as session:
        nested_loops_only(session)
        as_read = [(i, dag_id, w.clock.base) for i in ids[::2]]
        SchedulerJobRunner._delete_dataset_queue_rows_as_read(as_read, session)
        left = session.scalar(text("SELECT count(*) FROM dataset_dag_run_queue"))
        session.execute(delete_all)
    assert left == QUEUED - len(as_read)
    assert len(plans) == -(-len(as_read) // 500), plans  # one statement per 500 rows
    for plan in plans:
        assert "InitPlan" in plan and "LockRows" in plan, plan  # the locking select, run once
        # By address: a TID scan, or (when the statistics make the queue look small) one
        # scan of the queue that compares addresses; either way the queue is read once.
        assert "ctid = ANY ($1)" in plan, plan
        assert "Nested Loop" not in plan and "SubPlan" not in plan, plan


SWEPT = 600  # consumer DAGs of one dataset, half of them without their queue row


def test_the_sweep_probes_by_index_whatever_the_statistics(world):
    w = world
    a = w.dataset("a")
    w.consumer("first", [a])
    producer = w.producer("p")
    w.clock.at(1)
    assert w.emit(producer, a) == DONE
    with settings.engine.begin() as conn:  # statistics of a near-empty queue and reference table
        for table in ("dataset_dag_run_queue", "dag_schedule_dataset_reference", "dataset_event", "dag_run"):
            conn.execute(text(f"ANALYZE {table}"))
    w.consumers("c", [a], SWEPT)
    # the tables grow past their statistics, whatever earlier tests left
    with settings.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO dataset_event (dataset_id, timestamp, extra) SELECT id, to_timestamp(g), '{}' "
                "FROM dataset, generate_series(1, 20000) g WHERE uri = :uri"
            ),
            {"uri": a.uri},
        )
        conn.execute(
            text(
                "INSERT INTO dag_run (dag_id, run_id, execution_date, run_type, state, external_trigger, "
                "clear_number) SELECT :dag_id, 'history_' || g, to_timestamp(g), 'manual', 'success', "
                "true, 0 FROM generate_series(1, 20000) g"
            ),
            {"dag_id": f"{w.prefix}_history"},
        )
    w.clock.at(2)
    assert w.emit(producer, a) == DONE
    with settings.engine.begin() as conn:  # half the DAGs lose their row: the sweep's finds
        conn.execute(
            text(
                "DELETE FROM dataset_dag_run_queue WHERE target_dag_id LIKE :prefix "
                "AND right(target_dag_id, 1) IN ('1', '3', '5', '7', '9')"
            ),
            {"prefix": f"{w.prefix}_c%"},
        )
    scheduler = w.scheduler()
    with explained(lambda statement: "NOT (EXISTS" in statement) as plans, create_session() as session:
        nested_loops_only(session)
        found = scheduler.runner._dags_with_unqueued_dataset_events({}, session)
        session.rollback()
    assert len(found) == min(SWEPT // 2, DagModel.NUM_DAGS_PER_DAGRUN_QUERY)
    assert len(plans) == 1, plans
    for table in ("dataset_dag_run_queue", "dataset_event", "dag_run"):
        assert f"Seq Scan on {table}" not in plans[0], plans[0]


PLANNED_TABLES = ("log", "dataset_event", "dag_run", "dagrun_dataset_event")


def busy_dag(w: World):
    """One DAG on one dataset whose last ten minutes hold ``CONSUMED`` consumed events; (dataset, dag_id)."""
    a = w.dataset("a")
    dag_id = w.consumer("busy", [a])
    with create_session() as session:
        dataset_id = session.scalar(select(DatasetModel.id).where(DatasetModel.uri == a.uri))
    end = w.clock.base - timedelta(seconds=30)
    instants = [end - timedelta(minutes=10) * (CONSUMED - i) / CONSUMED for i in range(CONSUMED)]
    add_history({"single_a": dag_id}, {"a": dataset_id}, instants, 0, watches={"single_a": {"a"}})
    return a, dag_id


def datasets(w: World, count: int) -> list[int]:
    """The ids of ``count`` new datasets (queue rows need them: foreign key)."""
    with create_session() as session:
        session.add_all(DatasetModel(uri=f"race://{w.prefix}/q{i}") for i in range(count))
        session.flush()
        return sorted(
            session.scalars(select(DatasetModel.id).where(DatasetModel.uri.like(f"race://{w.prefix}/q%")))
        )


def queue_rows(w: World, dataset_ids: list[int], dag_ids: list[str]) -> None:
    """A queue row for each of ``dataset_ids`` and ``dag_ids``, written as is."""
    with create_session() as session:
        session.execute(
            DatasetDagRunQueue.__table__.insert(),
            [
                {"dataset_id": i, "target_dag_id": d, "created_at": w.clock.base}
                for d in dag_ids
                for i in dataset_ids
            ],
        )


def analyze(tables: tuple[str, ...] = PLANNED_TABLES) -> None:
    with settings.engine.begin() as conn:
        for table in tables:
            conn.execute(text(f"ANALYZE {table}"))


def forget_statistics(tables: tuple[str, ...] = PLANNED_TABLES) -> None:
    """As if never analyzed (a bulk load or a restore that autovacuum has not reached): no
    column statistics, and row counts the planner must guess from the tables' sizes."""
    with settings.engine.begin() as conn:
        for table in tables:
            conn.execute(text("DELETE FROM pg_statistic WHERE starelid = CAST(:t AS regclass)"), {"t": table})
            conn.execute(
                text("UPDATE pg_class SET reltuples = -1 WHERE oid = CAST(:t AS regclass)"), {"t": table}
            )


@contextmanager
def statistics_state(statistics: str) -> Iterator[None]:
    """``none`` (forgotten) or ``fresh`` statistics of the planned tables while inside; fresh after."""
    try:
        forget_statistics() if statistics == "none" else analyze()
        yield
    finally:
        analyze()  # the next tests' statistics


@pytest.mark.parametrize("statistics", ["none", "fresh"])
def test_the_newest_consumed_event_starts_from_the_latest_runs_events(world, statistics):
    """
    The floor's input (the newest event of each dataset that a DAG's latest run consumed) must
    cost that run's events, whatever the statistics: with none, the planner started from the
    dataset's whole history on ``idx_dataset_id_timestamp`` and probed the association table
    once per event (270-340 ms at 200 000 events, issue 30).
    """
    w = world
    a, _ = busy_dag(w)
    with statistics_state(statistics):
        producer, scheduler = w.producer("p"), w.scheduler()
        assert w.emit(producer, a) == DONE
        with explained(
            lambda statement: "LEFT OUTER JOIN dag_schedule_dataset_reference" in statement
        ) as plans:
            assert w.loop(scheduler) == DONE
    assert plans, "the loop sent no statement for the newest consumed events"
    for plan in plans:
        assert "idx_dataset_id_timestamp" not in plan and "Seq Scan on dataset_event" not in plan, plan
        assert "dataset_event_pkey" in plan, plan


@pytest.mark.parametrize("statistics", ["none", "near-empty", "fresh"])
def test_the_latest_run_is_read_in_index_order_whatever_the_statistics(world, statistics, monkeypatch):
    """
    A DAG's latest dataset-triggered run, read by every loop for every DAG it decides: its newest
    run in the order of the (dag_id, execution_date) index, stopping at the first, with no
    statistics, statistics taken before 2 000 runs were loaded and fresh ones. With run_type
    filtered in that scan, statistics of a near-empty table made the planner read all the DAG's
    runs with a bitmap scan and sort them (1.2 ms at 5 000 runs, against 10 us; issue 30). The
    search for an older one, when the newest run is not dataset-triggered, is planned as the
    statistics say, behind a one-time filter: run, it is never executed here.
    """
    monkeypatch.setenv(
        "AIRFLOW__DATASET_RACE_FIX__NET_LOOK_INTERVAL_SECONDS", "0"
    )  # the net's references at once
    w = world
    if statistics == "near-empty":
        analyze()
    a, _ = busy_dag(w)
    if statistics == "none":
        forget_statistics()
    elif statistics == "fresh":
        analyze()
    try:
        producer, scheduler = w.producer("p"), w.scheduler()
        assert w.emit(producer, a) == DONE
        # the loop's runs of the DAGs it decides, and the sweep's and the net's latest run per reference
        wanted = lambda statement: any(  # noqa: E731
            part in statement
            for part in (
                "LEFT OUTER JOIN dag_schedule_dataset_reference",
                "SELECT dag_schedule_dataset_reference.dag_id",
            )
        )
        with explained(wanted, run=True) as plans:
            assert w.loop(scheduler) == DONE
    finally:
        analyze()
    # the sweep's, the loop's, and the consumers of a new scheduler's backlog (its first look probes it,
    # when it holds late events: what earlier tests left in this database decides)
    assert len(plans) in (2, 3), plans
    for plan in plans:
        run_scans = [line for line in plan.splitlines() if "Scan" in line and " on dag_run " in line]
        assert run_scans, plan
        # each stopped at the DAG's newest (oldest) run, or never run (the search for another)
        for line in run_scans:
            assert "never executed" in line or (
                "Scan using dag_run_dag_id_execution_date_key on dag_run "
                in line.replace("Scan Backward", "Scan")
                and re.search(r"rows=1 loops=\d+\)", line)
            ), plan
    loop_scans = [
        [line for line in plan.splitlines() if " on dag_run " in line and "never executed" not in line]
        for plan in plans
    ]
    # the loop's: its DAG's newest run and its oldest
    assert [2] in [[len(scans)] for scans in loop_scans], plans


@pytest.mark.parametrize("statistics", ["none", "fresh"])
def test_the_net_reads_its_findings_and_marks_by_the_event_index(world, statistics):
    """
    The net keeps its findings and marks in Airflow's ``log`` table (BUG_REPORT, "The net"), which
    grows with every task (the audit log): they are read by ``idx_log_event``, never a scan of
    the table, with no statistics as with fresh ones.
    """
    from airflow.models import Log
    from airflow.utils import timezone
    from sqlalchemy import insert

    w = world
    with create_session() as session:  # an audit log of 20 000 rows of other events
        now = timezone.utcnow()
        session.execute(
            insert(Log), [{"dttm": now, "event": "running", "dag_id": f"d{i % 50}"} for i in range(20_000)]
        )
    w.dataset("a")
    scheduler = w.scheduler()
    with statistics_state(statistics):
        with explained(lambda statement: "FROM log" in statement) as plans, create_session() as session:
            scheduler.runner._dags_with_stranded_dataset_events(session)
            session.rollback()
    assert len(plans) >= 2, plans  # the marks, at a start, and the findings
    for plan in plans:
        assert "idx_log_event" in plan and "Seq Scan" not in plan, plan


PRODUCER_QUEUE = (
    200,
    100,
)  # queue rows of other DAGs and datasets beside a producer's: 200 DAGs x 100 datasets


@pytest.mark.parametrize("statistics", ["none", "near-empty", "fresh"])
def test_a_producers_commit_probes_the_queue_by_primary_key_whatever_the_statistics(world, statistics):
    """
    A producer's COMMIT on PostgreSQL (BUG_REPORT section 4): the SKIP LOCKED take of its
    existing rows, the insert of its keys with no row (its probe of the queue per key), the
    second take and the look for held rows each cost the keys they name, never a read of the
    queue, however many rows other DAGs keep queued and whatever the statistics say. (A queue
    of a few pages may be read once instead: the planner counts its pages as they are, not
    from statistics, so it scans only where a scan costs less than the probes; the probes
    inside the insert are SubPlans, one index probe per key, never a scan repeated per key.)
    """
    from airflow.datasets.manager import DatasetManager

    w = world
    dag_ids = [w.consumer(f"d{i}", [w.dataset("a")]) for i in range(3)]
    others = w.consumers("other", [w.dataset("a")], PRODUCER_QUEUE[0])
    ids = datasets(w, PRODUCER_QUEUE[1])
    tables = ("dataset_dag_run_queue", "dag")
    queue_rows(w, ids, dag_ids[:1])
    if statistics == "near-empty":
        analyze(tables)
    queue_rows(w, ids, others)
    if statistics == "none":
        forget_statistics(tables)
    elif statistics == "fresh":
        analyze(tables)
    # ids[0]: taken; ids[1]: held by another transaction; ids[-1] + its new DAGs: inserted
    keys = sorted([(ids[0], dag_ids[0]), (ids[1], dag_ids[0]), (ids[-1], dag_ids[1]), (ids[-1], dag_ids[2])])
    try:
        with settings.engine.connect() as other:
            holding = other.begin()
            other.execute(
                text(
                    "SELECT 1 FROM dataset_dag_run_queue WHERE dataset_id = :d AND target_dag_id = :t "
                    "FOR UPDATE"
                ),
                {"d": ids[1], "t": dag_ids[0]},
            )
            with explained(
                lambda s: (
                    "dataset_dag_run_queue" in s and not s.lstrip().upper().startswith(("UPDATE", "WITH"))
                )
            ) as plans:
                with create_session() as session:
                    nested_loops_only(session)
                    busy = DatasetManager._postgres_upsert_queue_rows(keys, [], session)
                    session.rollback()
            holding.rollback()
    finally:
        analyze(tables)
    assert busy == {(ids[1], dag_ids[0])}
    assert len(plans) == 4, plans  # take, insert, take of the keys left, look
    for plan in plans:  # by index: the primary key (or, for a DAG with no row, its index)
        assert "Seq Scan on dataset_dag_run_queue" not in plan, plan
        assert "Index" in plan, plan
