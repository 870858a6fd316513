"""
The fix's lock discipline, one deterministic interleaving per failure it must not add
(issue "Never fail or stall a task where stock Airflow would not"):

- the scheduler never waits for a producer (it takes queue rows ``SKIP LOCKED`` and
  deletes by primary key, at the end of its loop);
- producers never deadlock, whatever the order of a task's outlets (queue rows are
  written at COMMIT, in one key order);
- a producer never waits for the scheduler's run creation, only for its COMMIT;
- statements stay inside each backend's limits at any queue length;
- SQLite queue rows in any text format are deleted as read.

Each test drives two or three real sessions step by step and asserts on what each step
ended as (done, or blocked on a row lock as the database itself reports it). Two open
writers cannot exist on SQLite, so the interleavings that need them run on PostgreSQL and
MySQL/MariaDB only.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from airflow import settings
from airflow.datasets import DatasetAny
from airflow.models.dagrun import DagRun
from airflow.models.dataset import DatasetDagRunQueue, DatasetEvent, DatasetModel
from airflow.utils.session import create_session
from conftest import BACKEND
from sqlalchemy import event, func, select, text

from reproduce.harness.world import BLOCKED, DONE, PAUSED, World

servers_only = pytest.mark.skipif(BACKEND == "sqlite", reason="needs two open writers (SQLite has one)")


@pytest.fixture
def world(request, variant_fixed):
    w = World(request.node.name[:20])
    yield w
    w.close()


def _dataset_id(uri: str) -> int:
    with create_session() as session:
        return session.scalar(select(DatasetModel.id).where(DatasetModel.uri == uri))


def _queued(dag_id: str) -> list[int]:
    with create_session() as session:
        return sorted(
            session.scalars(
                select(DatasetDagRunQueue.dataset_id).where(DatasetDagRunQueue.target_dag_id == dag_id)
            )
        )


def _runs(dag_id: str) -> int:
    with create_session() as session:
        return session.scalar(select(func.count()).select_from(DagRun).where(DagRun.dag_id == dag_id))


@servers_only
def test_scheduler_does_not_wait_for_a_multi_outlet_task(world):
    """Issue item 1: task with outlets [b, a] against one scheduler loop (MariaDB deadlocked: 1213)."""
    w = world
    a, b = w.dataset("a"), w.dataset("b")
    d1, d2 = w.consumer("d1", [a]), w.consumer("d2", [b])
    p, producer, s = w.producer("P"), w.producer("P0"), w.scheduler()
    w.clock.at(1), w.emit(producer, a), producer.finish(), w.emit(producer, b), producer.finish()
    w.clock.at(2)
    assert w.emit(p, b, commit=False) == DONE  # the task registers its first outlet
    p.finish()
    assert w.loop(s) == DONE  # a whole scheduler loop, while the task's transaction is open
    s.finish()
    assert w.emit(p, a) == DONE  # second outlet and commit: no deadlock, no wait
    p.finish()
    assert (_runs(d1), _runs(d2)) == (1, 1)
    w.drain(s, start=10)
    assert w.report().violations() == {}


@servers_only
def test_opposite_outlet_orders_do_not_deadlock(world):
    """Issue item 2: outlets [a, b] and [b, a] on existing queue rows, interleaved."""
    w = world
    a, b = w.dataset("a"), w.dataset("b")
    w.consumer("on_a", [a], max_active_runs=1), w.consumer("on_b", [b], max_active_runs=1)
    w.consumer("a_or_b", DatasetAny(a, b), max_active_runs=1)
    p0, p1, p2, s = w.producer("P0"), w.producer("P1"), w.producer("P2"), w.scheduler()
    w.clock.at(1), w.emit(p0, a), p0.finish(), w.emit(p0, b), p0.finish()  # queue rows exist
    w.clock.at(2)
    for producer, dataset in ((p1, a), (p2, b), (p1, b), (p2, a)):
        assert w.emit(producer, dataset, commit=False) == DONE
        producer.finish()
    assert w.commit(p1) == DONE
    p1.finish()
    assert w.commit(p2) == DONE
    p2.finish()
    w.drain(s, start=10)
    assert w.report().violations() == {}


@servers_only
def test_a_row_a_producer_holds_is_skipped_never_waited_for(world):
    """Issue item 3: the delete visits no row but those it took (MySQL 8 planned it on target_dag_id)."""
    w = world
    a, b = w.dataset("a"), w.dataset("b")
    d = w.consumer("d", DatasetAny(a, b))
    p0, p, s = w.producer("P0"), w.producer("P"), w.scheduler()
    w.clock.at(1), w.emit(p0, a), p0.finish(), w.emit(p0, b), p0.finish()
    w.clock.at(2)
    p.pause_after(
        "update dataset_dag_run_queue"
    )  # b's row written (dated after its event), COMMIT not yet sent
    assert w.emit(p, b) == PAUSED
    assert w.loop(s) == DONE  # a run with E_a and E_b; b's row is held by P: skipped
    s.finish()
    assert _queued(d) == [_dataset_id(b.uri)]
    assert p.resume() == DONE
    p.finish()
    w.drain(s, start=10)
    assert _runs(d) == 2
    assert w.report().violations() == {}


@servers_only
def test_a_producer_does_not_wait_for_the_schedulers_run_creation(world):
    """Issue item 4: the queue rows are locked only by the loop's last statement, not from its start."""
    w = world
    a, b = w.dataset("a"), w.dataset("b")
    w.consumer("d1", [a]), w.consumer("d2", [b])
    p0, p, s = w.producer("P0"), w.producer("P"), w.scheduler()
    w.clock.at(1), w.emit(p0, a), p0.finish(), w.emit(p0, b), p0.finish()
    w.clock.at(2)
    s.pause_before("from dataset_event").pause_before("from dataset_event")
    assert w.loop(s) == PAUSED  # before d1's events
    assert s.resume() == PAUSED  # d1's run is created; before d2's events
    assert w.emit(p, a) == DONE  # stock PostgreSQL waits here for the scheduler's COMMIT
    p.finish()
    s.finish()
    w.drain(s, start=10)
    assert w.report().violations() == {}


@pytest.mark.skipif(BACKEND != "postgres", reason="PostgreSQL's producer statements")
def test_a_postgres_producer_commit_sends_short_statements_in_lock_order(world):
    """
    Stock PostgreSQL sends one queue statement per event (``INSERT .. ON CONFLICT DO
    NOTHING``). The fix sends at COMMIT, for the whole transaction: the SKIP LOCKED take of
    the existing rows, the insert of the keys with no row, a second take and the look for held
    rows (only when a key was neither taken nor inserted), then one statement that stamps its
    events, dates the queue rows one microsecond after them (Airflow's order) and returns the
    stamps (the events' UPDATE hands them to the rows' UPDATE in one WITH). Short statements
    for the take and the insert: a task's connection is new and a new server backend plans a
    statement of CTEs and joins for milliseconds (issue 30); the stamp's WITH joins nothing
    and, on a new backend, costs what its three former statements did. A row only taken is
    written once, by the dating (a second write would check its foreign key again and wait for
    a scheduler holding the DAG's row); a held row is not written.
    """
    w = world
    a, b = w.dataset("a"), w.dataset("b")
    x, y = w.consumer("x", [a, b]), w.consumer("y", [a])
    held = w.producer("held")
    assert w.emit(held, a) == DONE
    held.finish()  # (a, x) and (a, y) exist now
    sent: list[tuple[str, object]] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        sent.append((" ".join(statement.split()).lower(), parameters))

    # holds (a, y) as a committing producer does (its own connection)
    with settings.engine.connect() as other:
        transaction = other.begin()
        other.execute(
            text("SELECT 1 FROM dataset_dag_run_queue WHERE target_dag_id = :d FOR UPDATE"), {"d": y}
        )
        event.listen(settings.engine, "before_cursor_execute", record)
        try:
            with create_session() as session:
                from airflow.datasets.manager import dataset_manager

                dataset_manager.register_dataset_change(dataset=b, session=session)
                dataset_manager.register_dataset_change(dataset=a, session=session)
                session.flush()
                sent.clear()  # what stock sends too is behind us: the lookups and the event rows
        finally:
            event.remove(settings.engine, "before_cursor_execute", record)
        transaction.rollback()
    a_id, b_id = _dataset_id(a.uri), _dataset_id(b.uri)
    writes = [(s, p) for s, p in sent if not s.startswith(("commit", "release", "savepoint"))]
    kinds = [
        "take"
        if "for update skip locked" in s
        else "look"
        if s.startswith("select q.dataset_id")
        else "insert"
        if s.startswith("insert into dataset_dag_run_queue")
        else "stamp, date, read"
        if s.startswith("with c as (select clock_timestamp() as now), stamped as (update dataset_event")
        and "update dataset_dag_run_queue as q" in s
        and s.endswith("select id, timestamp from stamped")
        and ";" not in s
        else s
        for s, _ in writes
    ]
    assert kinds == ["take", "insert", "take", "look", "stamp, date, read"], kinds
    assert (
        "from dataset_dag_run_queue" in writes[0][0]
        and "join" not in writes[0][0]
        and " with " not in writes[0][0]
    )
    # the keys not taken: (a, y) is held, so only (b, x) is inserted (not waited for: it has a committed row)
    assert writes[1][1] == {"dataset_id_0": a_id, "dag_id_0": y, "dataset_id_1": b_id, "dag_id_1": x}
    assert "do nothing" in writes[1][0] and "do update" not in writes[1][0]
    # the one neither taken nor inserted: taken now (inserted by another producer meanwhile)? else held?
    assert writes[2][1] == writes[3][1] == {"dataset_id_0": a_id, "dag_id_0": y}
    dated = writes[-1][1]  # (a, y) is held: not dated
    assert [(dated[f"dataset_id_{i}"], dated[f"dag_id_{i}"]) for i in range(2)] == sorted(
        [(a_id, x), (b_id, x)]
    )
    assert "dataset_id_2" not in dated
    assert _queued(x) == sorted((a_id, b_id)) and _queued(y) == [a_id]


@pytest.mark.skipif(BACKEND != "postgres", reason="PostgreSQL's stamp and dating")
@pytest.mark.parametrize("outlets", [("b", "a", "a"), ("a",)], ids=["three events", "one event"])
def test_postgres_stamps_dates_and_reads_back_in_one_statement(world, outlets):
    """
    The stamp, the dating and the read-back are one statement (a WITH whose events' UPDATE
    hands its stamps to the queue rows' UPDATE): one parse and plan, one round trip, for any
    driver. The rows end dated after their events and the objects hold the committed stamps.
    One event (a task with one outlet) dates its rows by its own stamp, without the
    per-dataset newest of several.
    """
    w = world
    a, b = w.dataset("a"), w.dataset("b")
    x, y = w.consumer("x", [a, b]), w.consumer("y", [a])
    datasets = [{"a": a, "b": b}[name] for name in outlets]
    sent: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        lowered = statement.lower()
        if any(
            s in lowered
            for s in ("update dataset_event", "update dataset_dag_run_queue", "select id, timestamp")
        ):
            sent.append(lowered)

    from airflow.datasets.manager import dataset_manager

    for _ in range(2):  # new queue rows, then taken ones
        sent.clear()
        event.listen(settings.engine, "before_cursor_execute", record)
        try:
            with create_session() as session:
                events = [
                    dataset_manager.register_dataset_change(dataset=dataset, session=session)
                    for dataset in datasets
                ]
        finally:
            event.remove(settings.engine, "before_cursor_execute", record)
        assert len(sent) == 1 and ";" not in sent[0], sent  # stamp, date, read back
        assert ("newest as" in sent[0]) == (len(events) > 1), sent[0]
        with create_session() as session:
            stamps = dict(
                session.execute(
                    select(DatasetEvent.id, DatasetEvent.timestamp).where(
                        DatasetEvent.id.in_([e.id for e in events])
                    )
                ).all()
            )
            rows = session.execute(
                select(DatasetDagRunQueue.dataset_id, DatasetDagRunQueue.created_at).where(
                    DatasetDagRunQueue.target_dag_id.in_([x, y])
                )
            ).all()
        assert {
            e.id: e.timestamp for e in events
        } == stamps  # read back: the objects hold the committed stamps
        if len(events) > 1:
            assert events[1].timestamp == events[2].timestamp  # one clock for one dataset's events
        newest = {e.dataset_id: e.timestamp for e in events}
        assert len(rows) == (3 if "b" in outlets else 2)  # (a, x), (a, y), and (b, x) where b has an event
        assert all(newest[dataset_id] < created_at for dataset_id, created_at in rows)


def test_rows_are_written_at_commit_in_key_order_in_one_statement(world):
    """Both outlets of one transaction go out as one upsert (SQLite: one executemany), in (dataset_id,
    target_dag_id) order."""
    w = world
    a, b = w.dataset("a"), w.dataset("b")
    dags = [w.consumer(name, [a, b]) for name in ("y", "x")]
    statements: list[tuple[str, object]] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        if "insert into dataset_dag_run_queue" in statement.lower():
            statements.append((statement, parameters))

    event.listen(settings.engine, "before_cursor_execute", record)
    try:
        with create_session() as session:
            from airflow.datasets.manager import dataset_manager

            dataset_manager.register_dataset_change(dataset=b, session=session)
            dataset_manager.register_dataset_change(dataset=a, session=session)
            assert statements == []  # nothing written before COMMIT
    finally:
        event.remove(settings.engine, "before_cursor_execute", record)
    assert len(statements) == 1
    a_id, b_id = _dataset_id(a.uri), _dataset_id(b.uri)
    expected = sorted((ds, dag) for ds in (a_id, b_id) for dag in dags)
    statement, parameters = statements[0]
    if BACKEND in ("postgres", "mysql"):  # created_at is the server's clock
        assert [(parameters[f"dataset_id_{i}"], parameters[f"dag_id_{i}"]) for i in range(4)] == expected
    else:  # one executemany: (dataset_id, target_dag_id, created_at) per row, positional
        assert [(row[0], row[1]) for row in parameters] == expected
    for dag in dags:
        assert _queued(dag) == sorted((a_id, b_id))


def test_a_rolled_back_savepoint_or_transaction_writes_no_queue_row(world):
    w = world
    a, b, c = w.dataset("a"), w.dataset("b"), w.dataset("c")
    da, db, dc = w.consumer("on_a", [a]), w.consumer("on_b", [b]), w.consumer("on_c", [c])
    from airflow.datasets.manager import dataset_manager

    with create_session() as session:
        dataset_manager.register_dataset_change(dataset=a, session=session)
        try:
            with session.begin_nested():
                dataset_manager.register_dataset_change(dataset=b, session=session)
                raise RuntimeError("the SAVEPOINT is rolled back")
        except RuntimeError:
            pass
        with session.begin_nested():
            dataset_manager.register_dataset_change(dataset=c, session=session)
    assert (_queued(da) != [], _queued(db), _queued(dc) != []) == (True, [], True)

    session = settings.Session.session_factory()
    dataset_manager.register_dataset_change(dataset=b, session=session)
    session.rollback()
    session.commit()  # a later commit of the same session writes nothing of the rolled back one
    dataset_manager.register_dataset_change(dataset=b, session=session)
    session.close()  # closed without commit
    session = settings.Session.session_factory()
    session.commit()
    session.close()
    assert _queued(db) == []
    with create_session() as session:
        b_events = session.scalar(
            select(func.count())
            .select_from(DatasetEvent)
            .where(DatasetEvent.dataset_id == _dataset_id(b.uri))
        )
    assert b_events == 0


def test_sqlite_rows_in_any_text_format_are_deleted_as_read(world):
    """Issue item 6: rows written by raw SQL or older tools (no microseconds, '+00:00')."""
    if BACKEND != "sqlite":
        pytest.skip("a text format of SQLite's")
    w = world
    a, b = w.dataset("a"), w.dataset("b")
    d = w.consumer("d", DatasetAny(a, b))
    p, s = w.producer("P"), w.scheduler()
    w.clock.at(1), w.emit(p, a), p.finish(), w.emit(p, b), p.finish()
    base = w.clock.base.strftime("%Y-%m-%d %H:%M:%S")
    with create_session() as session:
        for uri, stored in ((a.uri, base), (b.uri, base + "+00:00")):
            session.execute(
                text(
                    "UPDATE dataset_dag_run_queue SET created_at = :stored WHERE dataset_id = :ds "
                    "AND target_dag_id = :d"
                ),
                {"stored": stored, "ds": _dataset_id(uri), "d": d},
            )
    w.clock.at(2), w.loop(s), s.finish()
    assert _queued(d) == [] and _runs(d) == 1
    # And a producer moves such a row forward into the canonical format.
    with create_session() as session:
        session.execute(
            text(
                "INSERT INTO dataset_dag_run_queue (dataset_id, target_dag_id, created_at) "
                "VALUES (:ds, :d, :stored)"
            ),
            {"stored": base + "+00:00", "ds": _dataset_id(a.uri), "d": d},
        )
    w.clock.at(-1), w.emit(p, a), p.finish()  # a lagging clock: the stamp follows a's newest event
    with create_session() as session:
        stored = session.scalar(
            text("SELECT created_at FROM dataset_dag_run_queue WHERE target_dag_id = :d"), {"d": d}
        )
    # canonical text, one microsecond after its event (stamped one past a's newest, at second 1)
    assert stored == (w.clock.base + timedelta(seconds=1, microseconds=2)).strftime("%Y-%m-%d %H:%M:%S.%f"), (
        stored
    )
    w.drain(s, start=10)
    assert w.report().violations() == {}


@pytest.mark.skipif(BACKEND != "mysql", reason="only InnoDB's lock wait timeout leaves the transaction open")
def test_a_failed_queue_upsert_keeps_the_rows_for_the_next_commit(world):
    """
    The queue rows are forgotten only once written: a COMMIT whose upsert timed out on a
    row lock (1205, which rolls back the statement, not the transaction) and is retried
    writes them then, instead of committing the event without them.
    """
    from sqlalchemy.exc import OperationalError

    w = world
    a = w.dataset("a")
    d = w.consumer("d", [a])
    holder, p = w.producer("holder"), w.producer("P")
    # The holder inserts the (a, d) row and keeps its transaction open: a key with no committed
    # row is waited for (as in stock), not left out as a busy existing row would be.
    holder.do(
        lambda session: session.execute(
            text(
                "INSERT INTO dataset_dag_run_queue (dataset_id, target_dag_id, created_at) "
                "VALUES (:a, :d, TIMESTAMPADD(SECOND, -5, NOW(6)))"
            ),
            {"a": _dataset_id(a.uri), "d": d},
        )
    )
    holder.finish()

    def register_and_commit_once(session):
        from airflow.datasets.manager import dataset_manager

        session.execute(text("SET SESSION innodb_lock_wait_timeout = 1"))
        dataset_manager.register_dataset_change(dataset=a, session=session)
        try:
            session.commit()
        except OperationalError as err:
            return err.orig.args[0]
        return None

    assert p.do(register_and_commit_once) in (DONE, BLOCKED)  # waits a second on the held row
    assert p.finish() == 1205  # the upsert gave up on the held row
    w.commit(holder), holder.finish()
    with create_session() as session:
        before = session.scalar(
            select(DatasetDagRunQueue.created_at).where(DatasetDagRunQueue.target_dag_id == d)
        )
    w.commit(p), p.finish()  # the caller commits again
    with create_session() as session:
        events = session.scalar(
            select(func.count())
            .select_from(DatasetEvent)
            .where(DatasetEvent.dataset_id == _dataset_id(a.uri))
        )
        after = session.scalar(
            select(DatasetDagRunQueue.created_at).where(DatasetDagRunQueue.target_dag_id == d)
        )
    assert events == 1
    assert after > before  # P's upsert was written at its second COMMIT


@servers_only
def test_deleting_a_consumer_dag_before_the_commit_fails_no_producer(world):
    """
    ``delete_dag`` (REST, CLI) between a producer's registration and its COMMIT: the
    deleted DAG loses its queue row, the other consumers keep theirs, the COMMIT succeeds
    (it failed on the queue row's foreign key: PostgreSQL ForeignKeyViolation, MariaDB 1452).
    """
    from airflow.api.common.delete_dag import delete_dag

    w = world
    a = w.dataset("a")
    gone, kept = w.consumer("gone", [a]), w.consumer("kept", [a])
    p, operator = w.producer("P"), w.producer("operator")
    assert w.emit(p, a, commit=False) == DONE  # registered: both DAGs are to be queued
    p.finish()
    assert operator.do(lambda session: delete_dag(gone, session=session)) == DONE
    operator.finish()
    w.commit(operator), operator.finish()
    assert w.commit(p) == DONE
    p.finish()  # raises if the COMMIT failed
    assert _queued(kept) == [_dataset_id(a.uri)]
    assert _queued(gone) == []
    with create_session() as session:
        assert (
            session.scalar(
                select(func.count())
                .select_from(DatasetEvent)
                .where(DatasetEvent.dataset_id == _dataset_id(a.uri))
            )
            == 1
        )


def _queue_of_size(w: World, queued: int) -> tuple[str, list[int]]:
    """A consumer DAG with ``queued`` queue rows (a dataset each: foreign key), statistics fresh."""
    dag_id = w.consumer("d", [w.dataset("a")])
    with create_session() as session:
        session.add_all(DatasetModel(uri=f"race://{w.prefix}/plan{i}") for i in range(queued))
        session.flush()
        ids = sorted(
            session.scalars(select(DatasetModel.id).where(DatasetModel.uri.like(f"race://{w.prefix}/plan%")))
        )
        session.execute(
            DatasetDagRunQueue.__table__.insert(),
            [{"dataset_id": i, "target_dag_id": dag_id, "created_at": w.clock.base} for i in ids],
        )
    with create_session() as session:
        session.execute(text("ANALYZE TABLE dataset_dag_run_queue"))
    return dag_id, ids


@pytest.mark.skipif(BACKEND != "mysql", reason="the MySQL/MariaDB DELETE statement")
@pytest.mark.parametrize("queued, deleted", [(4, 2), (10, 3), (50, 20), (1000, 300), (300, 300)])
def test_the_mysql_delete_looks_up_each_key_by_primary_key(world, queued, deleted):
    """
    The plan, not the timing: whatever the queue size and the fraction deleted, the
    scheduler's DELETE is one primary-key lookup per key it names (a full scan, which
    MariaDB chose for the former statement from about a fifth of the table on, waits on
    rows other transactions hold: a producer's COMMIT then failed with 1213).
    """
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner

    w = world
    dag_id, _ = _queue_of_size(w, queued)
    with create_session() as session:
        rows = session.execute(
            select(
                DatasetDagRunQueue.dataset_id, DatasetDagRunQueue.target_dag_id, DatasetDagRunQueue.created_at
            )
            .where(DatasetDagRunQueue.target_dag_id == dag_id)
            .order_by(DatasetDagRunQueue.dataset_id)
        ).all()
    plans: list[tuple] = []

    def explain(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("DELETE Q FROM"):
            cursor.execute("EXPLAIN " + statement, parameters)
            plans.extend(row for row in cursor.fetchall() if row[2] == "q")

    event.listen(settings.engine, "before_cursor_execute", explain)
    try:
        with create_session() as session:
            chosen = rows[:: max(1, queued // deleted)][:deleted]
            SchedulerJobRunner._delete_dataset_queue_rows_as_read([tuple(row) for row in chosen], session)
            session.rollback()
    finally:
        event.remove(settings.engine, "before_cursor_execute", explain)
    assert plans, "no DELETE was sent"
    assert {(row[3], row[5]) for row in plans} <= {("eq_ref", "PRIMARY"), ("const", "PRIMARY")}, plans


@pytest.mark.skipif(BACKEND != "mysql", reason="the MySQL/MariaDB plan of the producer's busy-row check")
@pytest.mark.parametrize("queued, named", [(10, 10), (1000, 1), (1000, 300)])
def test_the_producers_busy_row_check_reads_only_the_keys_it_names(world, queued, named):
    """
    Each producer COMMIT first takes its existing queue rows ``FOR UPDATE SKIP LOCKED``
    and reads which exist: both by primary key (a range or constant lookup on PRIMARY),
    whatever the queue's size, so a busy queue costs a producer nothing more.
    """
    from airflow.datasets.manager import DatasetManager

    w = world
    dag_id, ids = _queue_of_size(w, queued)
    plans: list[tuple] = []

    def explain(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("SELECT") and "dataset_dag_run_queue" in statement:
            cursor.execute("EXPLAIN " + statement, parameters)
            plans.append([row for row in cursor.fetchall() if row[2] in ("q", "dataset_dag_run_queue")])

    keys = [(i, dag_id) for i in ids[:: max(1, queued // named)][:named]]
    keys += [(ids[-1] + 1, dag_id)]  # and a new key: the existence check runs too
    event.listen(settings.engine, "before_cursor_execute", explain)
    try:
        with create_session() as session:
            assert DatasetManager._take_queue_rows(keys, session)[1] == set()
            session.rollback()
    finally:
        event.remove(settings.engine, "before_cursor_execute", explain)
    assert len(plans) == 2, plans  # the SKIP LOCKED take, then the look at held rows and DAGs
    accesses = {(row[3], row[5]) for plan in plans for row in plan}  # const: one key, a constant lookup
    assert accesses and accesses <= {("eq_ref", "PRIMARY"), ("const", "PRIMARY")}, plans


@servers_only
def test_a_task_committing_at_the_schedulers_delete_waits_only_for_its_commit(world):
    """
    X on ``a & c`` keeps its row (a, X), waiting for c; Y on ``b | e`` is ready. The
    scheduler stops just before its DELETE; a task with outlets [a, b] commits. The
    scheduler took (b, Y): the task leaves that row (after ``queue_row_wait_seconds``, 0
    by default) and commits; the DELETE must not wait on (a, X), which the task
    holds (MariaDB scanned the table: 1213). The scheduler's delete then removes (b, Y),
    and the sweep hands Y the task's event in the next loop.
    """
    import time

    from airflow.datasets import DatasetAll

    w = world
    a, b, c, e = w.dataset("a"), w.dataset("b"), w.dataset("c"), w.dataset("e")
    x, y = w.consumer("x", DatasetAll(a, c)), w.consumer("y", DatasetAny(b, e))
    p, task, s = w.producer("P"), w.producer("task"), w.scheduler()
    w.emit(p, a), p.finish()
    w.emit(p, b), p.finish()
    s.pause_before("delete from dataset_dag_run_queue", "delete q from")
    assert w.loop(s) == PAUSED  # Y's run created; (b, Y) taken FOR UPDATE; X waits for c

    def both_outlets(session):
        from airflow.datasets.manager import dataset_manager

        dataset_manager.register_dataset_change(dataset=a, session=session)
        dataset_manager.register_dataset_change(dataset=b, session=session)
        session.commit()

    started = time.monotonic()
    # (MariaDB's monitor may show a SKIP LOCKED read in LOCK WAIT for an instant: the time counts)
    assert task.do(both_outlets) in (DONE, BLOCKED)
    task.finish()  # raises if the task's COMMIT failed
    assert time.monotonic() - started < 3  # not the scheduler's pause
    assert s.resume() == DONE
    s.finish()
    assert _runs(y) == 1 and _runs(x) == 0
    assert _queued(x) == [_dataset_id(a.uri)]
    # MySQL took (b, Y) before its DELETE, and the row went with it; PostgreSQL takes it in the
    # DELETE itself, after the task wrote it, so it skipped the task's row
    assert _queued(y) == ([] if BACKEND == "mysql" else [_dataset_id(b.uri)])
    assert w.loop(s) == DONE  # MySQL: the sweep, as Y has an event newer than its run and no row
    s.finish()
    assert _runs(y) == 2
