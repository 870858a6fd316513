#
# Licensed to the Apache Software Foundation (ASF) under one
# or more contributor license agreements.  See the NOTICE file
# distributed with this work for additional information
# regarding copyright ownership.  The ASF licenses this file
# to you under the Apache License, Version 2.0 (the
# "License"); you may not use this file except in compliance
# with the License.  You may obtain a copy of the License at
#
#   http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing,
# software distributed under the License is distributed on an
# "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY
# KIND, either express or implied.  See the License for the
# specific language governing permissions and limitations
# under the License.
#
# Modified by the airflow-dataset-race-fix project: the members below are the members of
# airflow.datasets.manager.DatasetManager (Airflow 2.10.4) that the fix changes or adds,
# each kept as a small diff of the original. Only these members are copied; the rest of
# the class is Airflow's own.
"""
The producer side of the fix: forward-only dataset queue rows, written at commit.

``DatasetManager._queue_dagruns`` writes one ``DatasetDagRunQueue`` (DDRQ) row per
consuming DAG in the producer's transaction. Stock Airflow keeps an existing row as it
is (``ON CONFLICT DO NOTHING`` on PostgreSQL, a ``merge`` in a SAVEPOINT elsewhere), so
the row's ``created_at`` goes stale while new events arrive (S1), and concurrent
producers on MySQL/SQLite trade IntegrityErrors for stale rows (S7).

Here every write moves ``created_at`` strictly forward: to the producer's clock, or one
microsecond past the stored value when that clock is behind (another host, or a later
commit of an earlier flush). A write therefore always changes the row, which is what
lets the scheduler delete a row only "as it read it" (see ``scheduler_job_runner.py``):
a producer that touched the row after the scheduler read it is never deleted with it.

Lock discipline. An upsert that changes an existing row locks it until the producer's
transaction ends (stock PostgreSQL's ``DO NOTHING`` did not). So the rows are not written
when each outlet is registered: they are remembered on the session and written by one
upsert (chunked for the backends' statement limits) just before the producer's COMMIT,
after everything else the transaction flushes, in one global order ``(dataset_id,
target_dag_id)``. Every producer therefore takes queue-row locks in the same order and
holds them only for its COMMIT: producers cannot deadlock each other whatever the order
of a task's outlets, and the scheduler (which only takes these rows with ``SKIP LOCKED``)
never waits for them. A rolled back transaction or SAVEPOINT drops what it registered, so
a queue row is written if and only if its event commits. Queue rows of a transaction are
visible (to other sessions and to itself) from its COMMIT on, like its events.

This file is the single source of truth: the import-time shim installs these members on
Airflow's class and ``patches/`` are generated from this text. Write them as Airflow
code: every global they use must name the same object in ``airflow.datasets.manager``
(tests check it); anything else is imported inside the function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import exc

from airflow.models.dataset import DatasetDagRunQueue

if TYPE_CHECKING:
    from sqlalchemy.orm.session import Session, SessionTransaction

    from airflow.models.dag import DagModel


class DatasetManager:
    """Mirror of ``airflow.datasets.manager.DatasetManager``: only the members the fix changes."""

    @classmethod
    def _slow_path_queue_dagruns(
        cls, dataset_id: int, dags_to_queue: set[DagModel], session: Session
    ) -> None:
        # MySQL and SQLite have an upsert too: one statement at commit, no SAVEPOINT per DAG, no stale row.
        if session.bind.dialect.name in ("mysql", "sqlite"):
            return cls._defer_queue_dagruns(dataset_id, dags_to_queue, session)

        def _queue_dagrun_if_needed(dag: DagModel) -> str | None:
            item = DatasetDagRunQueue(target_dag_id=dag.dag_id, dataset_id=dataset_id)
            # Don't error whole transaction when a single RunQueue item conflicts.
            # https://docs.sqlalchemy.org/en/14/orm/session_transaction.html#using-savepoint
            try:
                with session.begin_nested():
                    session.merge(item)
            except exc.IntegrityError:
                cls.logger().debug("Skipping record %s", item, exc_info=True)
            return dag.dag_id

        queued_results = (_queue_dagrun_if_needed(dag) for dag in dags_to_queue)
        if queued_dag_ids := [r for r in queued_results if r is not None]:
            cls.logger().debug("consuming dag ids %s", queued_dag_ids)

    @classmethod
    def _postgres_queue_dagruns(cls, dataset_id: int, dags_to_queue: set[DagModel], session: Session) -> None:
        cls._defer_queue_dagruns(dataset_id, dags_to_queue, session)

    @classmethod
    def _defer_queue_dagruns(cls, dataset_id: int, dags_to_queue: set[DagModel], session: Session) -> None:
        """
        Remember the queue rows of this event; ``_write_deferred_queue_rows`` writes them at COMMIT.

        Each row remembers the (sub)transaction that registered it first, so that rolling
        back a SAVEPOINT forgets exactly the rows registered inside it.
        """
        from sqlalchemy import event

        deferred: dict[tuple[int, str], SessionTransaction] = session.info.setdefault(
            "airflow_dataset_race_fix.deferred_queue_rows", {}
        )
        transaction = session.get_nested_transaction() or session.get_transaction()
        for dag in dags_to_queue:
            deferred.setdefault((dataset_id, dag.dag_id), transaction)
        if not event.contains(session, "before_commit", cls._write_deferred_queue_rows):
            event.listen(session, "before_commit", cls._write_deferred_queue_rows)
            event.listen(session, "after_soft_rollback", cls._forget_rolled_back_queue_rows)
            event.listen(session, "after_transaction_end", cls._forget_ended_queue_rows)

    @classmethod
    def _write_deferred_queue_rows(cls, session: Session) -> None:
        """``before_commit``: write the remembered rows, unless only a SAVEPOINT is being released."""
        if session.in_nested_transaction():
            return
        deferred = session.info.pop("airflow_dataset_race_fix.deferred_queue_rows", None)
        if deferred:
            session.flush()  # the transaction's other writes first: the queue rows are its last
            cls._upsert_queue_dagruns(sorted(deferred), session)

    @classmethod
    def _forget_rolled_back_queue_rows(cls, session: Session, previous_transaction: SessionTransaction) -> None:
        """``after_soft_rollback``: forget the rows registered in the rolled back (sub)transaction."""
        deferred = session.info.get("airflow_dataset_race_fix.deferred_queue_rows")
        for key, transaction in list((deferred or {}).items()):
            while transaction is not None and transaction is not previous_transaction:
                transaction = transaction.parent
            if transaction is not None:
                del deferred[key]

    @classmethod
    def _forget_ended_queue_rows(cls, session: Session, transaction: SessionTransaction) -> None:
        """``after_transaction_end``: nothing outlives the outermost transaction (e.g. a close() without commit)."""
        if transaction.parent is None:
            session.info.pop("airflow_dataset_race_fix.deferred_queue_rows", None)

    @classmethod
    def _upsert_queue_dagruns(cls, rows: list[tuple[int, str]], session: Session) -> None:
        """
        Upsert queue rows ``(dataset_id, target_dag_id)``, given in key order; ``created_at`` only moves forward.

        An existing row gets ``max(now, stored + 1 microsecond)``: never older than the
        stored value (the guard), and always changed, so that a scheduler that read the row
        before this producer committed leaves it in place. The rows are locked in the order
        given. Statement size per backend: PostgreSQL binds two arrays (constant text, so
        SQLAlchemy compiles it once); MySQL gets 500 rows a statement (far below
        max_allowed_packet); SQLite 300 rows, 3 variables each (below the 999 variables of
        builds before 3.32).
        """
        from sqlalchemy import func, literal_column, text

        from airflow.utils import timezone

        dialect = session.bind.dialect
        now = timezone.utcnow()
        if dialect.name == "postgresql":
            session.execute(
                text(
                    "INSERT INTO dataset_dag_run_queue (dataset_id, target_dag_id, created_at) "
                    "SELECT dataset_id, target_dag_id, :created_at "
                    "FROM unnest(CAST(:dataset_ids AS INTEGER[]), CAST(:dag_ids AS VARCHAR[])) "
                    "AS q(dataset_id, target_dag_id) ORDER BY dataset_id, target_dag_id "
                    "ON CONFLICT (dataset_id, target_dag_id) DO UPDATE SET created_at = GREATEST("
                    "excluded.created_at, dataset_dag_run_queue.created_at + interval '1 microsecond')"
                ),
                {"created_at": now, "dataset_ids": [r[0] for r in rows], "dag_ids": [r[1] for r in rows]},
            )
            return

        if dialect.name == "mysql":
            # MySQL 8.0.19+ names the new row with an alias; VALUES() is deprecated there
            # (warning 1287). MariaDB has only VALUES().
            alias = not dialect.is_mariadb and dialect.server_version_info >= (8, 0, 19)
            new_created_at = "new.created_at" if alias else "VALUES(created_at)"
            for start in range(0, len(rows), 500):
                chunk = rows[start : start + 500]
                session.execute(
                    text(
                        "INSERT INTO dataset_dag_run_queue (dataset_id, target_dag_id, created_at) VALUES "
                        + ", ".join(f"(:dataset_id_{i}, :dag_id_{i}, :created_at)" for i in range(len(chunk)))
                        + (" AS new" if alias else "")
                        + f" ON DUPLICATE KEY UPDATE created_at = GREATEST({new_created_at}, "
                        "TIMESTAMPADD(MICROSECOND, 1, dataset_dag_run_queue.created_at))"
                    ),
                    {
                        "created_at": now.replace(tzinfo=None),  # the session's time zone is UTC (Airflow sets it)
                        **{f"dataset_id_{i}": row[0] for i, row in enumerate(chunk)},
                        **{f"dag_id_{i}": row[1] for i, row in enumerate(chunk)},
                    },
                )
            return

        from sqlalchemy.dialects.sqlite import insert

        # SQLite stores 'YYYY-MM-DD HH:MM:SS.ffffff' text; add one microsecond in integer
        # arithmetic (julianday() is a float and too coarse) and keep the format so that
        # text comparison stays chronological. A stored text without microseconds (or with
        # a '+00:00' suffix, as raw SQL writes it) counts as .000000.
        micros = (
            "(strftime('%s', substr(dataset_dag_run_queue.created_at, 1, 19)) * 1000000"
            " + CASE WHEN substr(dataset_dag_run_queue.created_at, 20, 1) = '.'"
            " THEN CAST(substr(dataset_dag_run_queue.created_at, 21, 6) AS INTEGER) ELSE 0 END + 1)"
        )
        successor = literal_column(
            f"strftime('%Y-%m-%d %H:%M:%S', {micros} / 1000000, 'unixepoch')"
            f" || printf('.%06d', {micros} % 1000000)"
        )
        for start in range(0, len(rows), 300):
            stmt = insert(DatasetDagRunQueue).values(
                [
                    {"dataset_id": dataset_id, "target_dag_id": dag_id, "created_at": now}
                    for dataset_id, dag_id in rows[start : start + 300]
                ]
            )
            stmt = stmt.on_conflict_do_update(
                index_elements=[DatasetDagRunQueue.dataset_id, DatasetDagRunQueue.target_dag_id],
                set_={"created_at": func.max(stmt.excluded.created_at, successor)},
            )
            session.execute(stmt)
