"""
What the web page's list (Browse > Dataset runs) reads for its findings column (issue 31 item 8).

1. The same counts as audit's ``check`` over the look-back window (``invariant.check_window``
   against ``invariant.check``), on every backend: doubled, suspected lost and lost events,
   events before the window, a dataset a DAG no longer references.

2. On PostgreSQL, what the list's statements read must follow the window's events and their
   links, whatever the statistics: none, taken before a bulk load (the planner then believed
   a DAG's run had consumed a handful of events, merged the DAG's whole consumption with
   every event of the window, and ran for minutes at 50 000 events), and fresh. Each
   statement is run under EXPLAIN ANALYZE and the rows its plan handled are added up.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Iterator

import pytest
from airflow import settings
from airflow.models.dagrun import DagRun
from airflow.models.dataset import DatasetDagRunQueue, DatasetEvent, DatasetModel, association_table
from airflow.utils.session import create_session
from airflow.utils.state import DagRunState
from airflow.utils.types import DagRunType
from conftest import BACKEND
from matrix import ON_MAIN_RELEASE_ONLY
from sqlalchemy import event, insert, select, text
from test_lock_discipline import _dataset_id

from airflow_dataset_race_fix.diagnostics import invariant
from reproduce.harness.world import World


@pytest.fixture
def world(request, variant_fixed):
    w = World(request.node.name[:20])
    yield w
    w.close()


_tags = iter(range(10**9))


def _events(dataset_id: int, instants: list[datetime]) -> list[int]:
    """Events of ``dataset_id`` at ``instants``; their ids in that order."""
    tag = f"bulk_{next(_tags)}"
    with create_session() as session:
        for start in range(0, len(instants), 5000):
            session.execute(
                insert(DatasetEvent),
                [
                    {
                        "dataset_id": dataset_id,
                        "timestamp": t,
                        "extra": {},
                        "source_dag_id": "producer",
                        "source_task_id": "emit",
                        "source_run_id": tag,
                        "source_map_index": -1,
                    }
                    for t in instants[start : start + 5000]
                ],
            )
        return list(
            session.scalars(
                select(DatasetEvent.id)
                .where(DatasetEvent.dataset_id == dataset_id, DatasetEvent.source_run_id == tag)
                .order_by(DatasetEvent.id)
            )
        )


def _run(dag_id: str, name: str, date: datetime, event_ids: list[int]) -> None:
    """A DATASET_TRIGGERED run of ``dag_id`` dated ``date`` that consumed ``event_ids``."""
    with create_session() as session:
        session.execute(
            insert(DagRun),
            [
                {
                    "dag_id": dag_id,
                    "run_id": f"dataset_triggered__{name}",
                    "execution_date": date,
                    "state": DagRunState.SUCCESS,
                    "run_type": DagRunType.DATASET_TRIGGERED,
                    "external_trigger": False,
                    "data_interval_start": date,
                    "data_interval_end": date,
                    "queued_at": date,
                    "start_date": date,
                    "end_date": date,
                    "clear_number": 0,
                }
            ],
        )
        run_id = session.scalar(
            select(DagRun.id).where(DagRun.dag_id == dag_id, DagRun.run_id == f"dataset_triggered__{name}")
        )
        for start in range(0, len(event_ids), 5000):
            session.execute(
                insert(association_table),
                [{"dag_run_id": run_id, "event_id": i} for i in event_ids[start : start + 5000]],
            )


COUNTS = (
    "produced",
    "consumed",
    "runs",
    "lost",
    "suspected_lost",
    "doubled",
    "empty_runs",
    "out_of_order",
    "future_dated",
    "overlapping_intervals",
)


def test_the_window_count_is_audits_count_over_the_window(world):
    w = world
    a, b = w.dataset("a"), w.dataset("b")
    one, both = w.consumer("one", [a]), w.consumer("both", [a, b])
    a_id, b_id = _dataset_id(a.uri), _dataset_id(b.uri)
    now = datetime.now(timezone.utc)
    since = now - timedelta(hours=1)
    old = _events(a_id, [now - timedelta(hours=3, minutes=i) for i in range(3)])  # before the window
    on_a = _events(a_id, [now - timedelta(minutes=50 - i) for i in range(8)])
    on_b = _events(b_id, [now - timedelta(minutes=40 - i) for i in range(4)])
    _run(one, "old", now - timedelta(hours=2), old[:2])  # old[2]: lost, but not in the window
    _run(one, "1", now - timedelta(minutes=30), on_a[:3])
    _run(one, "2", now - timedelta(minutes=20), on_a[2:5])  # on_a[2] doubled; on_a[5:]: after the runs
    _run(both, "1", now - timedelta(minutes=25), on_a[:2] + on_b[:1])  # on_a[2:4] suspected lost
    _run(both, "2", now - timedelta(minutes=15), on_b[1:3])
    _run(both, "empty", now - timedelta(minutes=10), [])
    _run(both, "3", now - timedelta(minutes=12), on_a[4:6])  # out of order (created after "empty")
    # a dataset ``one`` does not reference, of which a run of it consumed an event
    with create_session() as session:
        session.add(DatasetModel(uri=f"race://{w.prefix}/gone"))
    _run(
        one,
        "gone",
        now - timedelta(minutes=5),
        _events(_dataset_id(f"race://{w.prefix}/gone"), [now - timedelta(minutes=6)]),
    )
    with create_session() as session:  # b's events wait for ``both`` (not lost); a's do not
        session.execute(
            insert(DatasetDagRunQueue), [{"dataset_id": b_id, "target_dag_id": both, "created_at": now}]
        )

    with create_session() as session:
        audited = invariant.check(session, [one, both], since=since).by_dag()
        counted = invariant.check_window(session, [one, both], since=since).by_dag()
    for dag_id in (one, both):
        assert {c: getattr(counted[dag_id], c) for c in COUNTS} == {
            c: getattr(audited[dag_id], c) for c in COUNTS
        }
        assert counted[dag_id].findings() == audited[dag_id].findings()
    assert audited[one].doubled == 1 and audited[one].produced == 8
    assert (
        audited[both].suspected_lost >= 2
        and audited[both].empty_runs == 1
        and audited[both].out_of_order == 1
    )
    assert audited[one].lost == 3 and audited[both].lost == 4  # b's unconsumed event is queued: not lost


# -- PostgreSQL: what the statements read ------------------------------------------------------
WINDOW = 4_000  # events one run consumed within the look-back window
HISTORY = 4_000  # and events an earlier run consumed before it
SMALL = 30  # other DAGs of one dataset, as on a page


@contextmanager
def rows_handled() -> Iterator[list[tuple[int, str]]]:
    """(rows, statement) for each statement sent while inside: the rows its plan's nodes handled
    (read from tables and indexes, and thrown away by a join filter), from EXPLAIN ANALYZE on the server,
    with a cursor's own plan for a streamed statement (DECLARE)."""
    handled: list[tuple[int, str]] = []

    def explain(conn, cursor, statement, parameters, context, executemany):
        if not statement.lstrip().upper().startswith("SELECT"):
            return
        streamed = getattr(cursor, "name", None) is not None  # psycopg2's named (server-side) cursor
        with cursor.connection.cursor() as probe:
            probe.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) "
                + ("DECLARE adrf_probe CURSOR FOR " if streamed else "")
                + statement,
                parameters,
            )
            plan = probe.fetchone()[0]
        plan = plan if isinstance(plan, list) else json.loads(plan)
        handled.append((_rows(plan[0]["Plan"]), statement))

    event.listen(settings.engine, "before_cursor_execute", explain)
    try:
        yield handled
    finally:
        event.remove(settings.engine, "before_cursor_execute", explain)


def _rows(node: dict) -> int:
    """Rows read from a table or an index (kept or filtered out), and pairs a join's filter threw away."""
    loops = node.get("Actual Loops", 0)
    here = node.get("Rows Removed by Join Filter", 0)
    if "Relation Name" in node or "Index Name" in node:
        here += node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
    return int(here * loops) + sum(_rows(child) for child in node.get("Plans", []))


def _forget_statistics(tables: tuple[str, ...]) -> None:
    """As tests/test_query_plans.py: as if never analyzed."""
    with settings.engine.begin() as conn:
        for table in tables:
            conn.execute(text("DELETE FROM pg_statistic WHERE starelid = CAST(:t AS regclass)"), {"t": table})
            conn.execute(
                text("UPDATE pg_class SET reltuples = -1 WHERE oid = CAST(:t AS regclass)"), {"t": table}
            )


def _analyze(tables: tuple[str, ...]) -> None:
    with settings.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in tables:
            conn.execute(text(f"ANALYZE {table}"))


@ON_MAIN_RELEASE_ONLY
@pytest.mark.skipif(BACKEND != "postgres", reason="PostgreSQL's plans of the list's findings")
@pytest.mark.parametrize("statistics", ["behind", "none", "fresh"])
def test_the_lists_findings_read_the_window_whatever_the_statistics(world, statistics):
    from airflow_dataset_race_fix.web import listing

    w = world
    a, b = w.dataset("a"), w.dataset("b")
    big = w.consumer("big", [b])
    small = w.consumers("c", [a], SMALL)
    tables = (
        "dataset_event",
        "dag_run",
        "dagrun_dataset_event",
        "dag_schedule_dataset_reference",
        "dataset_dag_run_queue",
    )
    now = datetime.now(timezone.utc)
    a_id, b_id = _dataset_id(a.uri), _dataset_id(b.uri)
    on_a = _events(a_id, [now - timedelta(minutes=9, seconds=i) for i in range(SMALL)])
    for dag_id in small:  # a run each that consumed a's events, before the bulk load
        _run(dag_id, "1", now - timedelta(minutes=8), on_a)
    if statistics == "behind":  # the last ANALYZE: before the bulk load
        _analyze(tables)
    history = _events(b_id, [now - timedelta(hours=3) + timedelta(seconds=i) for i in range(HISTORY)])
    _run(big, "history", now - timedelta(hours=2), history)
    in_window = _events(
        b_id, [now - timedelta(minutes=10) + timedelta(milliseconds=100 * i) for i in range(WINDOW)]
    )
    _run(big, "first", now - timedelta(minutes=2), in_window)
    if statistics == "none":
        _forget_statistics(tables)
    elif statistics == "fresh":
        _analyze(tables)

    found = [{"dag_id": dag_id, "verdict": "waits", "_late": []} for dag_id in [big] + small]
    with rows_handled() as handled, create_session() as session:
        # the plans such statistics choose, made certain (as tests/test_query_plans.py)
        if statistics != "fresh":
            for setting in ("enable_hashagg", "enable_hashjoin", "enable_mergejoin", "enable_material"):
                session.execute(text(f"SET LOCAL {setting} = off"))
        listing.add_findings(session, found, now)
        session.rollback()
    assert {row["dag_id"]: row["findings"] for row in found} == {dag_id: {} for dag_id in [big] + small}
    # The window's events and their links, a few times over (each DAG's events, each event's
    # links and their runs, the produced count: about ten reads for each, a bitmap scan's index
    # and heap counted apart); never the window times the DAG's consumption.
    assert handled, "the list sent no statement"
    total = sum(rows for rows, _ in handled)
    worst = max(handled)
    # Each window event is read by each statement of the batches (up to three) with up to ten
    # reads there (the event, its reference, its links and their runs, an index's and a heap's
    # rows counted apart): CI's full run, no statistics, read 33 000 rows in one statement for
    # 4 030 events, 101 000 in all. Linear; the quadratic read it guards against was 28.9 million.
    bound = 30 * (WINDOW + SMALL * SMALL) + 2_000
    assert total <= bound, (statistics, total, bound, worst[0], worst[1][:600])
