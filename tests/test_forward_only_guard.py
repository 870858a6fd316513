"""
The producer's queue upsert on this backend: created_at only ever moves forward, in one statement
(PostgreSQL: rows it took apart from new keys).

``created_at`` is the database's clock: moved with ``time-machine`` on SQLite (the host's
clock), and through the fix's clock expression on the servers.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import time_machine
from airflow import settings
from airflow.models.dag import DagModel
from airflow.models.dataset import DatasetDagRunQueue, DatasetModel
from airflow.utils.session import create_session
from conftest import BACKEND
from sqlalchemy import event, select, update

from reproduce.harness.world import World

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


def _custom_manager():
    """A deployment's ``[core] dataset_manager_class`` that overrides nothing we patch."""
    from airflow.datasets.manager import DatasetManager

    class BroadcastingDatasetManager(DatasetManager):
        def notify_dataset_changed(self, dataset):
            return None

    return BroadcastingDatasetManager


def _database_clock_at(monkeypatch, at: datetime) -> None:
    """Servers: the fix's database clock reads ``at`` (a literal in the real SQL). SQLite's is this host's."""
    from airflow.datasets.manager import DatasetManager

    literal = at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
    clock = {"postgres": f"TIMESTAMPTZ '{literal}+00'", "mysql": f"TIMESTAMP('{literal}')"}.get(BACKEND)
    if clock is not None:
        monkeypatch.setattr(DatasetManager, "_database_clock", classmethod(lambda cls, dialect_name: clock))


@pytest.fixture(params=["DatasetManager", "custom subclass"])
def queue(request, variant_fixed, monkeypatch):
    """Three consuming DAGs of one dataset; yields (dataset_id, dag_ids, upsert, stored)."""
    world = World("guard")
    a = world.dataset("a")
    dag_ids = [world.consumer(f"d{i}", [a]) for i in range(3)]
    with create_session() as session:
        dataset_id = session.scalar(select(DatasetModel.id).where(DatasetModel.uri == a.uri))

    def upsert(at: datetime, dags=dag_ids) -> int:
        """Queue ``dags`` at producer time ``at``; returns the number of queue writes sent (the
        busy-row check before them reads, and sends no SAVEPOINT)."""
        from airflow.datasets.manager import DatasetManager

        manager = DatasetManager if request.param == "DatasetManager" else _custom_manager()

        statements = []

        def count(conn, cursor, statement, *args):
            if "dataset_dag_run_queue" in statement and not statement.lstrip().upper().startswith("SELECT"):
                statements.append(statement)

        _database_clock_at(monkeypatch, at)
        event.listen(settings.engine, "before_cursor_execute", count)
        try:
            # The rows are written at the producer's commit: the clock must still be at ``at`` then.
            with time_machine.travel(at, tick=False), create_session() as session:
                models = set(session.scalars(select(DagModel).where(DagModel.dag_id.in_(dags))))
                manager._queue_dagruns(dataset_id=dataset_id, dags_to_queue=models, session=session)
        finally:
            event.remove(settings.engine, "before_cursor_execute", count)
        return len(statements)

    def stored() -> dict[str, datetime]:
        with create_session() as session:
            return dict(
                session.execute(
                    select(DatasetDagRunQueue.target_dag_id, DatasetDagRunQueue.created_at).where(
                        DatasetDagRunQueue.dataset_id == dataset_id
                    )
                ).all()
            )

    yield dataset_id, dag_ids, upsert, stored
    world.close()


def test_one_statement_for_all_consuming_dags(queue):
    _, dag_ids, upsert, stored = queue
    assert upsert(T0) == 1
    assert stored() == {dag_id: T0 for dag_id in dag_ids}
    assert upsert(T0 + timedelta(seconds=1)) == 1  # conflicts too: still one statement, no SAVEPOINT


def test_newer_timestamp_moves_the_row_forward(queue):
    _, dag_ids, upsert, stored = queue
    upsert(T0)
    upsert(T0 + timedelta(seconds=5))
    assert stored() == {dag_id: T0 + timedelta(seconds=5) for dag_id in dag_ids}


def test_older_timestamp_never_moves_it_back_but_still_changes_it(queue):
    _, dag_ids, upsert, stored = queue
    upsert(T0 + timedelta(seconds=5))
    upsert(T0)  # a producer whose clock lags, or an earlier flush committed later
    assert stored() == {dag_id: T0 + timedelta(seconds=5, microseconds=1) for dag_id in dag_ids}
    upsert(T0 + timedelta(seconds=5, microseconds=1))  # equal: one microsecond further
    assert stored() == {dag_id: T0 + timedelta(seconds=5, microseconds=2) for dag_id in dag_ids}


@pytest.mark.parametrize(
    "stored_at, expected",
    [
        (datetime(2026, 3, 1, 12, 0, 59, 999999), datetime(2026, 3, 1, 12, 1, 0, 0)),
        (datetime(2026, 12, 31, 23, 59, 59, 999999), datetime(2027, 1, 1, 0, 0, 0, 0)),
        (datetime(2026, 3, 1, 12, 0, 0, 0), datetime(2026, 3, 1, 12, 0, 0, 1)),
    ],
    ids=["second", "year", "zero-micro"],
)
def test_one_microsecond_carries_over(queue, stored_at, expected):
    dataset_id, dag_ids, upsert, stored = queue
    upsert(T0, dags=dag_ids[:1])
    stored_at, expected = stored_at.replace(tzinfo=timezone.utc), expected.replace(tzinfo=timezone.utc)
    with create_session() as session:
        session.execute(
            update(DatasetDagRunQueue)
            .where(DatasetDagRunQueue.dataset_id == dataset_id)
            .values(created_at=stored_at)
        )
    upsert(T0 - timedelta(days=400), dags=dag_ids[:1])
    assert stored() == {dag_ids[0]: expected}


def test_new_and_existing_rows_in_one_statement(queue):
    _, dag_ids, upsert, stored = queue
    upsert(T0, dags=dag_ids[:1])
    # PostgreSQL writes a row it took apart from the insert of new keys (with an event: by the
    # dating after the stamp, so that no row is written twice; BUG_REPORT section 4)
    assert upsert(T0 - timedelta(seconds=1)) == (2 if BACKEND == "postgres" else 1)
    assert stored() == {
        dag_ids[0]: T0 + timedelta(microseconds=1),
        dag_ids[1]: T0 - timedelta(seconds=1),
        dag_ids[2]: T0 - timedelta(seconds=1),
    }


def _upsert_sent(name: str) -> tuple[str, Exception | None]:
    """The queue upsert one producer transaction sends, and the error it ended with, if any."""
    from airflow.datasets.manager import dataset_manager

    world = World(name)
    sent, error = [], None
    listener = lambda conn, cursor, statement, *args: sent.append(statement)  # noqa: E731
    try:
        a = world.dataset("a")
        world.consumer("d", [a])
        event.listen(settings.engine, "before_cursor_execute", listener)
        try:
            with create_session() as session:
                dataset_manager.register_dataset_change(dataset=a, session=session)
        except Exception as err:
            error = err
    finally:
        event.remove(settings.engine, "before_cursor_execute", listener)
        world.close()
    return next(s for s in sent if s.startswith("INSERT INTO dataset_dag_run_queue")), error


@pytest.mark.skipif(BACKEND != "mysql", reason="MySQL dialect only")
def test_mysql_8_gets_the_row_alias_form_not_the_deprecated_values(variant_fixed, monkeypatch):
    """MySQL 8.0.20+ warns (1287) on VALUES() in ON DUPLICATE KEY UPDATE; MariaDB has only VALUES().

    No MySQL 8 server here: the dialect is made to look like one and the statement sent is
    checked (MariaDB then rejects the alias syntax, which is expected)."""
    from sqlalchemy.exc import ProgrammingError

    monkeypatch.setattr(settings.engine.dialect, "is_mariadb", False)
    monkeypatch.setattr(settings.engine.dialect, "server_version_info", (8, 0, 32))
    upsert, error = _upsert_sent("mysql8")
    assert isinstance(error, ProgrammingError)
    assert " AS new ON DUPLICATE KEY UPDATE created_at = GREATEST(new.created_at, " in upsert
    assert "VALUES(created_at)" not in upsert


@pytest.mark.skipif(BACKEND != "mysql", reason="MySQL dialect only")
def test_mariadb_keeps_values(variant_fixed):
    upsert, error = _upsert_sent("mariadb_values")
    assert error is None
    assert "GREATEST(VALUES(created_at), " in upsert
