"""
What the loop's statements read on MariaDB/MySQL and SQLite, counted by the server, not timed:
the PostgreSQL counterpart (its plans, read with EXPLAIN) is test_query_plans.py.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import pytest
from airflow import settings
from airflow.models.dataset import DagScheduleDatasetReference
from airflow.utils.session import create_session
from conftest import BACKEND
from matrix import ON_MAIN_RELEASE_ONLY
from sqlalchemy import event, func, select, text
from test_query_plans import CONSUMED, busy_dag

from reproduce.harness.world import DONE, World

pytestmark = [
    ON_MAIN_RELEASE_ONLY,
    pytest.mark.skipif(
        BACKEND == "postgres", reason="MariaDB's and SQLite's reads (PostgreSQL: test_query_plans.py)"
    ),
]


@pytest.fixture
def world(request, variant_fixed):
    w = World("plans_" + request.node.callspec.id)
    yield w
    w.close()


def _mysql_reads(cursor) -> int:
    cursor.execute("SHOW SESSION STATUS LIKE 'Handler_read%%'")
    return sum(int(value) for _, value in cursor.fetchall())


@contextmanager
def reads_per_statement() -> Iterator[list[tuple[int, str]]]:
    """(rows read, statement) of each statement sent while inside: MySQL's Handler_read_*
    counters, SQLite's virtual machine steps (a progress handler called every step)."""
    counted: list[tuple[int, str]] = []
    steps = [0]

    def before(conn, cursor, statement, parameters, context, executemany):
        raw = conn.connection.dbapi_connection
        if BACKEND == "sqlite":
            steps[0] = 0
            raw.set_progress_handler(lambda: steps.__setitem__(0, steps[0] + 1), 1)
        else:
            with raw.cursor() as probe:
                conn.info["adrf_reads"] = _mysql_reads(probe)

    def after(conn, cursor, statement, parameters, context, executemany):
        raw = conn.connection.dbapi_connection
        if BACKEND == "sqlite":
            raw.set_progress_handler(None, 1)
            counted.append((steps[0], statement))
        else:
            with raw.cursor() as probe:
                counted.append((_mysql_reads(probe) - conn.info.pop("adrf_reads"), statement))

    event.listen(settings.engine, "before_cursor_execute", before)
    event.listen(settings.engine, "after_cursor_execute", after)
    try:
        yield counted
    finally:
        event.remove(settings.engine, "before_cursor_execute", before)
        event.remove(settings.engine, "after_cursor_execute", after)


@contextmanager
def other_dags_paused(w: World) -> Iterator[None]:
    """Earlier tests' DAGs paused while inside: the sweep reads every active DAG's references,
    and the bound is about this DAG's history, not about how many DAGs the session left."""
    from airflow.models.dag import DagModel
    from sqlalchemy import select, update

    with create_session() as session:
        others = session.scalars(
            select(DagModel.dag_id).where(
                DagModel.is_paused.is_(False), ~DagModel.dag_id.startswith(w.prefix)
            )
        ).all()
        session.execute(update(DagModel).where(DagModel.dag_id.in_(others)).values(is_paused=True))
    try:
        yield
    finally:
        with create_session() as session:
            session.execute(update(DagModel).where(DagModel.dag_id.in_(others)).values(is_paused=False))


def statistics(state: str) -> None:
    """``fresh``: ANALYZE the tables the loop reads; ``none``: as after a bulk load (SQLite:
    no sqlite_stat1, which Airflow never creates; MariaDB: its persistent statistics dropped)."""
    tables = ("dataset_event", "dag_run", "dagrun_dataset_event", "dataset_dag_run_queue")
    with settings.engine.begin() as conn:
        if state == "fresh":
            for table in tables:
                conn.execute(text(f"ANALYZE {'' if BACKEND == 'sqlite' else 'TABLE '}{table}"))
        elif BACKEND == "sqlite":
            conn.execute(text("DROP TABLE IF EXISTS sqlite_stat1"))
        else:
            for table in tables:
                conn.execute(
                    text(
                        "DELETE FROM mysql.innodb_index_stats WHERE database_name = DATABASE() "
                        "AND table_name = :t"
                    ),
                    {"t": table},
                )
                conn.execute(
                    text(
                        "DELETE FROM mysql.innodb_table_stats WHERE database_name = DATABASE() "
                        "AND table_name = :t"
                    ),
                    {"t": table},
                )
    settings.engine.dispose()  # new connections: SQLite reads its statistics when it opens


# the net's read of the new ids: 5 000 at most by construction
# (a first start reads the last 10 000 again, two looks)
NET_IDS = (
    "SELECT dataset_event.id, dataset_event.dataset_id, dataset_event.timestamp FROM dataset_event WHERE"
)
FROM_REFERENCES = "FROM dag_schedule_dataset_reference JOIN dag ON"  # the sweep's references


@pytest.mark.parametrize("state", ["none", "near-empty", "fresh"])
def test_no_statement_of_the_loop_reads_the_datasets_history(world, state):
    """
    A loop after one new event on a DAG whose window holds ``CONSUMED`` consumed events reads
    what the floor keeps (the last ``commit_latency_seconds`` of them) and one probe per
    reference, never the dataset's history, whatever the statistics: none (a bulk load, and
    SQLite's usual state: Airflow never ANALYZEs it), taken on near-empty tables before the
    load, or fresh. MariaDB with fresh statistics read all 20 000 events for the sweep's
    correlated ``max()`` of each reference's newest event, every sweep, until it became an
    ``ORDER BY .. LIMIT 1`` (issue 30).
    """
    w = world
    if state == "near-empty":
        statistics("fresh")
    a, dag_id = busy_dag(w)
    if state != "near-empty":
        statistics(state)
    producer, scheduler = w.producer("p"), w.scheduler()
    assert w.emit(producer, a) == DONE
    with other_dags_paused(w), reads_per_statement() as counted:
        assert w.loop(scheduler) == DONE
    # MariaDB counts rows read; SQLite counts virtual-machine steps, four or more per row an
    # index scan reads: a read of the history costs more than CONSUMED either way, the
    # floor's window of events (about CONSUMED / 60 here) a fraction of it. The sweep and the
    # net start from the reference table, which follows the fleet the session left (20 000
    # references after test_size_limits), not the history: MariaDB's bound allows a read a
    # row; SQLite's steps there (20 to 50 a row, paused DAGs' rows included) are left out.
    with create_session() as session:
        references = session.scalar(select(func.count()).select_from(DagScheduleDatasetReference))
    bound = CONSUMED // 4 + references if BACKEND == "mysql" else CONSUMED
    judged = [  # the statements that read events (Airflow's own read the DAG table, the fleet's size)
        (n, s)
        for n, s in counted
        if "dataset_event" in s
        and not " ".join(s.split()).startswith(NET_IDS)
        and not (BACKEND == "sqlite" and FROM_REFERENCES in s)
    ]
    history_reads = [(n, " ".join(s.split())[:400]) for n, s in judged if n > bound]
    assert not history_reads, history_reads
    assert any("dataset_event" in s for _, s in counted)  # the loop did read events
