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
The producer side of the fix: forward-only dataset queue rows.

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
    from sqlalchemy.orm.session import Session

    from airflow.models.dag import DagModel


class DatasetManager:
    """Mirror of ``airflow.datasets.manager.DatasetManager``: only the members the fix changes."""

    @classmethod
    def _slow_path_queue_dagruns(
        cls, dataset_id: int, dags_to_queue: set[DagModel], session: Session
    ) -> None:
        # MySQL and SQLite have an upsert too: one statement, no SAVEPOINT per DAG, no stale row.
        if session.bind.dialect.name in ("mysql", "sqlite"):
            return cls._upsert_queue_dagruns(dataset_id, dags_to_queue, session)

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
        cls._upsert_queue_dagruns(dataset_id, dags_to_queue, session)

    @classmethod
    def _upsert_queue_dagruns(cls, dataset_id: int, dags_to_queue: set[DagModel], session: Session) -> None:
        """
        Queue all consuming DAGs in one upsert whose ``created_at`` only moves forward.

        An existing row gets ``max(new, stored + 1 microsecond)``: never older than the
        stored value (the guard), and always changed, so that a scheduler that read the row
        before this producer committed leaves it in place. Rows are written in key order so
        that concurrent producers and the scheduler take row locks in one order.
        """
        from sqlalchemy import func, literal_column, text

        from airflow.utils import timezone

        dialect_name = session.bind.dialect.name
        dag_ids = sorted({dag.dag_id for dag in dags_to_queue})
        now = timezone.utcnow()
        if dialect_name == "postgresql":
            # The same statement text whatever the number of DAGs, so SQLAlchemy compiles it
            # once: its PostgreSQL insert() is never cached, and compiling a VALUES row per
            # DAG cost more than running the statement.
            session.execute(
                text(
                    "INSERT INTO dataset_dag_run_queue (dataset_id, target_dag_id, created_at) "
                    "SELECT :dataset_id, dag_id, :created_at FROM unnest(:dag_ids) AS dag_id ORDER BY dag_id "
                    "ON CONFLICT (dataset_id, target_dag_id) DO UPDATE SET created_at = GREATEST("
                    "excluded.created_at, dataset_dag_run_queue.created_at + interval '1 microsecond')"
                ),
                {"dataset_id": dataset_id, "created_at": now, "dag_ids": dag_ids},
            )
            return

        if dialect_name == "mysql":
            from sqlalchemy.dialects.mysql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert

        stmt = insert(DatasetDagRunQueue).values(
            [{"dataset_id": dataset_id, "target_dag_id": dag_id, "created_at": now} for dag_id in dag_ids]
        )
        stored = DatasetDagRunQueue.created_at
        if dialect_name == "mysql":
            successor = func.timestampadd(literal_column("MICROSECOND"), 1, stored)
            stmt = stmt.on_duplicate_key_update(created_at=func.greatest(stmt.inserted.created_at, successor))
        else:
            # SQLite stores 'YYYY-MM-DD HH:MM:SS.ffffff' text; add one microsecond in integer
            # arithmetic (julianday() is a float and too coarse) and keep the format so that
            # text comparison stays chronological.
            micros = (
                "(strftime('%s', substr(dataset_dag_run_queue.created_at, 1, 19)) * 1000000"
                " + substr(dataset_dag_run_queue.created_at, 21, 6) + 1)"
            )
            successor = literal_column(
                f"strftime('%Y-%m-%d %H:%M:%S', {micros} / 1000000, 'unixepoch')"
                f" || printf('.%06d', {micros} % 1000000)"
            )
            stmt = stmt.on_conflict_do_update(
                index_elements=[DatasetDagRunQueue.dataset_id, DatasetDagRunQueue.target_dag_id],
                set_={"created_at": func.max(stmt.excluded.created_at, successor)},
            )
        session.execute(stmt)
