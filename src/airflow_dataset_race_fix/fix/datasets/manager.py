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
The producer side of the fix: forward-only dataset queue rows and event stamps, written at commit.

A producer's queue rows are remembered on the session and written by one upsert just before its
COMMIT, in key order, each ``created_at`` moved strictly forward (so the scheduler can delete a row
exactly as it read it); then its events are dated on the database's clock, forward-only per dataset.
Why, and why it is safe: BUG_REPORT.md section 4 ("Producer: forward-only queue rows, written at
commit", "Producer: events dated at their COMMIT, on the database's clock", "Lock discipline",
"A stalled producer") and section 6 ("The floor").

This file is the single source of truth: the import-time shim installs these members on
Airflow's class and ``patches/`` are generated from this text. Write them as Airflow
code: every global they use must name the same object in ``airflow.datasets.manager``
(tests check it); anything else is imported inside the function.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from sqlalchemy import exc, select
from sqlalchemy.orm import joinedload

from airflow.api_internal.internal_api_call import internal_api_call
from airflow.models.dataset import (
    DagScheduleDatasetAliasReference,
    DagScheduleDatasetReference,
    DatasetAliasModel,
    DatasetDagRunQueue,
    DatasetEvent,
    DatasetModel,
)
from airflow.stats import Stats
from airflow.utils.session import NEW_SESSION, provide_session

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.orm.session import Session, SessionTransaction

    from airflow.datasets import Dataset
    from airflow.models.dag import DagModel
    from airflow.models.taskinstance import TaskInstance


class DatasetManager:
    """Mirror of ``airflow.datasets.manager.DatasetManager``: only the members the fix changes."""

    @staticmethod
    def _dataset_race_fix_settings() -> dict[str, tuple[int | float, str]]:
        """``[dataset_race_fix]`` settings, ``key -> (default, meaning)``, read by ``_dataset_race_fix_setting``."""
        return {
            "commit_latency_seconds": (3, "scheduler: a producer's stamp-to-COMMIT time that the floor allows for"),
            "event_lookback_seconds": (900, "scheduler: how far below the latest run the net and the sweep look"),
            "max_event_ahead_seconds": (60, "events dated further ahead of the database's clock wait for it"),
            "net_look_interval_seconds": (0.5, "scheduler: how often the net looks at the event ids; 0: every loop"),
            "queue_row_wait_seconds": (0.0, "producer: how long to retry a queue row another producer holds"),
            "requeue_interval_seconds": (10.0, "scheduler: how often the sweep looks for events without a queue row"),
        }

    @classmethod
    def _dataset_race_fix_setting(cls, key: str) -> int | float:
        """``[dataset_race_fix] key``, never below 0 (an int, or a float where the default is one)."""
        from airflow.configuration import conf

        default = cls._dataset_race_fix_settings()[key][0]
        read = conf.getfloat if isinstance(default, float) else conf.getint
        return max(0, read("dataset_race_fix", key, fallback=default))

    @classmethod
    @internal_api_call
    @provide_session
    def register_dataset_change(
        cls,
        *,
        task_instance: TaskInstance | None = None,
        dataset: Dataset,
        extra=None,
        session: Session = NEW_SESSION,
        source_alias_names: Iterable[str] | None = None,
        **kwargs,
    ) -> DatasetEvent | None:
        """
        Register dataset related changes.

        For local datasets, look them up, record the dataset event, queue dagruns, and broadcast
        the dataset event
        """
        # todo: add test so that all usages of internal_api_call are added to rpc endpoint
        dataset_model = session.scalar(
            select(DatasetModel)
            .where(DatasetModel.uri == dataset.uri)
            .options(joinedload(DatasetModel.consuming_dags).joinedload(DagScheduleDatasetReference.dag))
        )
        if not dataset_model:
            cls.logger().warning("DatasetModel %s not found", dataset)
            return None

        event_kwargs = {
            "dataset_id": dataset_model.id,
            "extra": extra,
        }
        if task_instance:
            event_kwargs.update(
                {
                    "source_task_id": task_instance.task_id,
                    "source_dag_id": task_instance.dag_id,
                    "source_run_id": task_instance.run_id,
                    "source_map_index": task_instance.map_index,
                }
            )

        dataset_event = DatasetEvent(**event_kwargs)
        session.add(dataset_event)
        cls._stamp_at_commit(dataset_event, session)

        dags_to_queue_from_dataset = {
            ref.dag for ref in dataset_model.consuming_dags if ref.dag.is_active and not ref.dag.is_paused
        }
        dags_to_queue_from_dataset_alias = set()
        if source_alias_names:
            dataset_alias_models = session.scalars(
                select(DatasetAliasModel)
                .where(DatasetAliasModel.name.in_(source_alias_names))
                .options(
                    joinedload(DatasetAliasModel.consuming_dags).joinedload(
                        DagScheduleDatasetAliasReference.dag
                    )
                )
            ).unique()

            for dsa in dataset_alias_models:
                dsa.dataset_events.append(dataset_event)
                session.add(dsa)

                dags_to_queue_from_dataset_alias |= {
                    alias_ref.dag
                    for alias_ref in dsa.consuming_dags
                    if alias_ref.dag.is_active and not alias_ref.dag.is_paused
                }

        dags_to_reparse = dags_to_queue_from_dataset_alias - dags_to_queue_from_dataset
        if dags_to_reparse:
            file_locs = {dag.fileloc for dag in dags_to_reparse}
            cls._send_dag_priority_parsing_request(file_locs, session)
        session.flush()

        cls.notify_dataset_changed(dataset=dataset)

        Stats.incr("dataset.updates")

        dags_to_queue = dags_to_queue_from_dataset | dags_to_queue_from_dataset_alias
        cls._queue_dagruns(dataset_id=dataset_model.id, dags_to_queue=dags_to_queue, session=session)
        session.flush()
        return dataset_event

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
        """Remember this event's queue rows for ``_write_at_commit``, with the (sub)transaction that first added each."""
        deferred: dict[tuple[int, str], SessionTransaction] = session.info.setdefault(
            "airflow_dataset_race_fix.deferred_queue_rows", {}
        )
        transaction = session.get_nested_transaction() or session.get_transaction()
        for dag in dags_to_queue:
            deferred.setdefault((dataset_id, dag.dag_id), transaction)
        cls._listen_for_commit(session)

    @classmethod
    def _stamp_at_commit(cls, dataset_event: DatasetEvent, session: Session) -> None:
        """Remember a new event; ``_write_at_commit`` dates it on the database's clock at COMMIT."""
        session.info.setdefault("airflow_dataset_race_fix.events_to_stamp", []).append(dataset_event)
        cls._listen_for_commit(session)

    @classmethod
    def _listen_for_commit(cls, session: Session) -> None:
        from sqlalchemy import event

        if not event.contains(session, "before_commit", cls._write_at_commit):
            event.listen(session, "before_commit", cls._write_at_commit)
            event.listen(session, "after_soft_rollback", cls._forget_rolled_back_queue_rows)
            event.listen(session, "after_transaction_end", cls._forget_ended_queue_rows)

    @classmethod
    def _write_at_commit(cls, session: Session) -> None:
        """``before_commit`` of the outermost transaction: queue rows, then event stamps, as its last statements."""
        if session.in_nested_transaction():
            return
        deferred = session.info.get("airflow_dataset_race_fix.deferred_queue_rows")
        events = session.info.get("airflow_dataset_race_fix.events_to_stamp")
        if not deferred and not events:
            return
        session.flush()  # the transaction's other writes first: these are its last
        if deferred:  # the rows, then the stamps, then the rows dated after their events
            cls._upsert_queue_dagruns(sorted(deferred), events or [], session)
        elif events:
            cls._stamp_events_and_date_queue_rows(events, [], session)
        session.info.pop("airflow_dataset_race_fix.deferred_queue_rows", None)  # only once written: a failure retries
        session.info.pop("airflow_dataset_race_fix.events_to_stamp", None)

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
            session.info.pop("airflow_dataset_race_fix.events_to_stamp", None)

    @classmethod
    def _database_clock(cls, dialect_name: str) -> str | None:
        """The SQL of the clock that dates events, queue rows and runs; None: this host's (SQLite). Tests replace it."""
        return {"postgresql": "clock_timestamp()", "mysql": "NOW(6)"}.get(dialect_name)

    @classmethod
    def _database_now(cls, session: Session) -> datetime:
        """The database's clock, now (see ``_database_clock``)."""
        from sqlalchemy import literal_column

        from airflow.utils import timezone
        from airflow.utils.sqlalchemy import UtcDateTime

        clock = cls._database_clock(session.bind.dialect.name)
        if clock is None:
            return timezone.utcnow()
        return session.scalar(select(literal_column(clock, UtcDateTime)))

    @staticmethod
    def _send(session: Session, statement: str, params: dict[str, object] | list[dict[str, object]]):
        """
        Send ``statement`` as written, its parameters named ``%(name)s`` (psycopg2's and mysqlclient's style; ``:name``
        for SQLite's driver), on the session's connection; a list of parameters: executemany. At a task's COMMIT, a
        text() construct and the ORM's execute cost about 0.1 ms of Python a statement, as much as the server's work
        for a short one (issue 30); the engine's cursor events still fire. Results come as the driver returns them.
        """
        import re

        if session.bind.dialect.name == "sqlite":
            statement = re.sub(r"%\((\w+)\)s", r":\1", statement)
        return session.connection().exec_driver_sql(statement, params)

    @staticmethod
    def _utc_text(stamp: datetime) -> str:
        """``stamp`` as a statement's parameter: MySQL's DATETIME(6) in UTC, SQLite's text as Airflow writes it."""
        from airflow.utils import timezone

        return stamp.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")  # text compares chronologically

    @classmethod
    def _stamp_events_and_date_queue_rows(
        cls, events: list[DatasetEvent], rows: list[tuple[int, str]], session: Session
    ) -> None:
        """Stamp ``events``, then date the queue rows ``rows`` (taken or written here) after them: the COMMIT's last."""
        if session.bind.dialect.name == "postgresql":
            return cls._postgres_stamp_events_and_date_queue_rows(events, rows, session)
        cls._stamp_events(events, session)
        cls._date_queue_rows_after_their_events(rows, events, session)

    @classmethod
    def _postgres_stamp_events_and_date_queue_rows(
        cls, events: list[DatasetEvent], rows: list[tuple[int, str]], session: Session
    ) -> None:
        """
        PostgreSQL: ``_stamp_events`` and ``_date_queue_rows_after_their_events`` computed by the server in one
        statement, which returns the stamps: the UPDATE of the events hands its new stamps (RETURNING) to the UPDATEs
        of the queue rows in the same WITH. One statement, not three: at a task's COMMIT each statement costs 0.4-0.6
        ms (parse, plan, snapshot, result), far more than it runs; on a task's new backend the WITH costs what the
        three did (issue 30). It writes rows this transaction holds already (its events, its taken or inserted queue
        rows) and changes no key: no lock wait; its snapshot is taken after every row was locked (the take is an
        earlier statement). A taken row of a dataset with an event is written here only, once
        (``_postgres_upsert_queue_rows``).
        """
        from datetime import timedelta

        from sqlalchemy import inspect
        from sqlalchemy.orm.attributes import set_committed_value

        from airflow.utils.sqlalchemy import UtcDateTime

        by_id = {e.id: e for e in events if inspect(e).persistent}
        if not by_id:
            return
        stamped = {e.dataset_id for e in by_id.values()}
        rows = [row for row in rows if row[0] in stamped]
        clock = cls._database_clock("postgresql")
        params: dict[str, object] = {
            "ahead": timedelta(seconds=cls._dataset_race_fix_setting("max_event_ahead_seconds")),
        }
        if len(by_id) == 1:  # a task with one outlet: one row, one stamp, which dates the rows; 0.3 ms less to plan
            (params["event_id"],) = by_id
            this, other = "e.id = %(event_id)s", "o.id <> %(event_id)s"
            now, clock_once, newest = clock, [], []  # one row: its SET reads the clock (a CTE costs 0.1 ms to plan)
            stamp_of_row = "(SELECT s.timestamp FROM stamped AS s)"
        else:
            params["event_ids"] = sorted(by_id)
            ids = "CAST(%(event_ids)s AS INTEGER[])"
            this, other = f"e.id = ANY({ids})", f"o.id <> ALL({ids})"
            # One clock for all the events: a WITH query holding a volatile function is evaluated once.
            now, clock_once = "c.now", [f"c AS (SELECT {clock} AS now)"]
            newest = ["newest AS (SELECT dataset_id, max(timestamp) AS stamp FROM stamped GROUP BY dataset_id)"]
            stamp_of_row = "(SELECT n.stamp FROM newest AS n WHERE n.dataset_id = q.dataset_id)"
        # Forward-only per dataset, but never following an event dated far ahead of the clock (as _stamp_events): the
        # newest other event + 1 microsecond when it lies between the clock and the clock + ahead, else the clock
        # (GREATEST skips the CASE's NULL; COALESCE: no other event). The newest is read and planned once.
        parts = [
            *clock_once,
            f"stamped AS (UPDATE dataset_event AS e SET timestamp = COALESCE((SELECT GREATEST({now}, CASE WHEN "
            f"o.timestamp < {now} + CAST(%(ahead)s AS INTERVAL) THEN o.timestamp + interval '1 microsecond' END) "
            f"FROM dataset_event AS o WHERE o.dataset_id = e.dataset_id AND {other} ORDER BY o.timestamp DESC "
            f"LIMIT 1), {now}){' FROM c' if clock_once else ''} WHERE {this} "
            "RETURNING e.id, e.dataset_id, e.timestamp)",
            *newest,
        ]
        for start in range(0, len(rows), 500):  # a row IN list: one primary-key probe per row
            pairs, keys = cls._postgres_row_in_list(rows[start : start + 500], start)
            params.update(keys)
            parts.append(
                f"dated_{start} AS (UPDATE dataset_dag_run_queue AS q SET created_at = GREATEST(q.created_at + "
                f"interval '1 microsecond', {stamp_of_row} + interval '1 microsecond') "
                f"WHERE (q.dataset_id, q.target_dag_id) IN ({pairs}))"
            )
        dialect, as_utc = session.bind.dialect, UtcDateTime().process_result_value
        for event_id, stamp in cls._send(session, f"WITH {', '.join(parts)} SELECT id, timestamp FROM stamped", params):
            set_committed_value(by_id[event_id], "timestamp", as_utc(stamp, dialect))

    @classmethod
    def _stamp_events(cls, events: list[DatasetEvent], session: Session) -> None:
        """
        MySQL/MariaDB, SQLite: date this transaction's events on the database's clock, forward-only per dataset
        (BUG_REPORT section 4).
        """
        from collections import defaultdict
        from datetime import datetime, timedelta

        from sqlalchemy import inspect
        from sqlalchemy.orm.attributes import set_committed_value

        from airflow.utils import timezone
        from airflow.utils.sqlalchemy import UtcDateTime

        by_dataset: dict[int, list[DatasetEvent]] = defaultdict(list)
        for dataset_event in events:
            if inspect(dataset_event).persistent:
                by_dataset[dataset_event.dataset_id].append(dataset_event)
        ahead = timedelta(seconds=cls._dataset_race_fix_setting("max_event_ahead_seconds"))
        dialect = session.bind.dialect
        clock = cls._database_clock(dialect.name)

        def as_utc(value: datetime | str | None) -> datetime | None:
            """A timestamp as the driver returns it (SQLite: text), as Airflow's ``UtcDateTime`` reads it."""
            if isinstance(value, str):
                value = datetime.fromisoformat(value)
            return UtcDateTime().process_result_value(value, dialect)

        def ids_in(name: str, ids: list[int]) -> tuple[str, dict[str, object]]:
            """``(%(name_0)s, ..)`` and its parameters."""
            return (
                "(" + ", ".join(f"%({name}_{i})s" for i in range(len(ids))) + ")",
                {f"{name}_{i}": event_id for i, event_id in enumerate(ids)},
            )

        event_ids = {dataset_id: [e.id for e in of_dataset] for dataset_id, of_dataset in by_dataset.items()}
        dataset_ids = sorted(by_dataset)
        for start in range(0, len(dataset_ids), 100):
            chunk = dataset_ids[start : start + 100]
            params: dict[str, object] = {}
            newest_other = f"SELECT {clock or 'NULL'}"  # SQLite: this host's clock, read below
            for i, dataset_id in enumerate(chunk):
                ids, id_params = ids_in(f"event_id_{i}", event_ids[dataset_id])
                params.update(id_params, **{f"dataset_id_{i}": dataset_id})
                newest_other += (
                    f", (SELECT timestamp FROM dataset_event WHERE dataset_id = %(dataset_id_{i})s "
                    f"AND id NOT IN {ids} ORDER BY timestamp DESC LIMIT 1)"
                )
            now, *newest_timestamps = map(as_utc, cls._send(session, newest_other, params).one())
            if clock is None:
                now = timezone.utcnow()
            for dataset_id, newest_timestamp in zip(chunk, newest_timestamps):
                stamp = now
                # Forward-only, but never following an event dated far ahead of the clock.
                if newest_timestamp is not None and now < newest_timestamp + timedelta(microseconds=1) <= now + ahead:
                    stamp = newest_timestamp + timedelta(microseconds=1)
                ids, params = ids_in("event_id", event_ids[dataset_id])
                params["stamp"] = cls._utc_text(stamp)
                cls._send(session, f"UPDATE dataset_event SET timestamp = %(stamp)s WHERE id IN {ids}", params)
                for dataset_event in by_dataset[dataset_id]:
                    set_committed_value(dataset_event, "timestamp", stamp)

    @classmethod
    def _take_queue_rows(
        cls, rows: list[tuple[int, str]], session: Session
    ) -> tuple[set[tuple[int, str]], set[tuple[int, str]], set[str]]:
        """
        MySQL/MariaDB: lock the existing queue rows among ``rows`` without waiting; return (taken, held by others, the
        DAGs among ``rows`` that exist). One statement takes, and one more, only for keys not taken, reads without a
        lock whether each has a committed row (held by another) and whether its DAG exists (``delete_dag`` does not
        wait for the producer). A row committed or deleted between the two counts as held (looked at again) or as
        new (upserted in key order): both safe.
        """
        from sqlalchemy import bindparam, text

        dialect = session.bind.dialect
        skip_locked = (10, 6) if dialect.is_mariadb else (8, 0, 1)
        if (dialect.server_version_info or ()) < skip_locked:  # no SKIP LOCKED: upsert all, waiting as stock does
            dag_ids = sorted({dag_id for _, dag_id in rows})
            dags_that_exist = text("SELECT dag_id FROM dag WHERE dag_id IN :ids").bindparams(
                bindparam("ids", expanding=True)
            )
            live = set()
            for start in range(0, len(dag_ids), 500):
                live.update(session.scalars(dags_that_exist, {"ids": dag_ids[start : start + 500]}))
            return set(), set(), live

        taken: set[tuple[int, str]] = set()
        busy: set[tuple[int, str]] = set()
        live: set[str] = set()
        for start in range(0, len(rows), 500):
            chunk = rows[start : start + 500]
            source, params = cls._queue_keys_joined_first(chunk)  # one primary-key probe per key
            take = f"SELECT q.dataset_id, q.target_dag_id FROM {source} FOR UPDATE SKIP LOCKED"
            taken_here = set(map(tuple, cls._send(session, take, params)))
            taken.update(taken_here)
            # A taken row's DAG exists to this COMMIT (deleting the DAG deletes the row, which this transaction holds).
            live.update(dag_id for _, dag_id in taken_here)
            if len(taken_here) == len(chunk):
                continue
            source, params = cls._queue_keys_joined_first([k for k in chunk if k not in taken_here], "LEFT JOIN")
            look = (
                "SELECT k.dataset_id, k.target_dag_id, q.dataset_id IS NOT NULL, "
                f"EXISTS (SELECT 1 FROM dag WHERE dag.dag_id = k.target_dag_id) FROM {source}"
            )
            for dataset_id, dag_id, held, dag_exists in cls._send(session, look, params):
                if held:
                    busy.add((dataset_id, dag_id))
                if dag_exists:
                    live.add(dag_id)
        return taken, busy, live

    @staticmethod
    def _queue_keys_joined_first(
        keys: list[tuple[int, str]], join: str = "STRAIGHT_JOIN"
    ) -> tuple[str, dict[str, object]]:
        """
        MySQL/MariaDB: a FROM clause of keys ``k`` (``join``) queue rows ``q`` by primary key, and its parameters
        (``_send``'s placeholders).
        """
        derived = " UNION ALL ".join(
            f"SELECT %(dataset_id_{i})s AS dataset_id, %(dag_id_{i})s AS target_dag_id" for i in range(len(keys))
        )
        params: dict[str, object] = {}
        for i, (dataset_id, dag_id) in enumerate(keys):
            params[f"dataset_id_{i}"], params[f"dag_id_{i}"] = dataset_id, dag_id
        return (
            f"({derived}) AS k {join} dataset_dag_run_queue AS q FORCE INDEX (PRIMARY) "
            "ON q.dataset_id = k.dataset_id AND q.target_dag_id = k.target_dag_id",
            params,
        )

    @classmethod
    def _upsert_queue_dagruns(cls, rows: list[tuple[int, str]], events: list[DatasetEvent], session: Session) -> None:
        """
        Upsert queue rows ``(dataset_id, target_dag_id)``, given in key order, leaving out those another transaction
        holds (committed rows: the DAG stays queued; BUG_REPORT, "A stalled producer"); then stamp ``events``. Lock
        order: taking existing rows never waits and new keys go in key order, so producers form no cycle; polling, not
        a lock wait with a timeout, as rows taken out of key order could close one (InnoDB: 1213).
        """
        import time

        busy = cls._upsert_queue_rows_not_held(rows, events, session)
        deadline = time.monotonic() + (cls._dataset_race_fix_setting("queue_row_wait_seconds") if busy else 0)
        pause = 0.001  # a producer's COMMIT holds a row for milliseconds: look again soon, then less often
        while busy and time.monotonic() < deadline:  # the last look at the deadline: the whole wait is polled
            time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
            pause = min(2 * pause, 0.008)
            busy = cls._upsert_queue_rows_not_held(sorted(busy), events, session)
        # Every row locked first: the floor.
        cls._stamp_events_and_date_queue_rows(events, [row for row in rows if row not in busy], session)
        if busy:
            Stats.incr("dataset_race_fix.busy_queue_rows_left_out", len(busy))
            cls.logger().info(
                "%d dataset queue row(s) held by another transaction past [dataset_race_fix] queue_row_wait_seconds "
                "left as they are (the DAGs stay queued by them): %s",
                len(busy),
                sorted(busy)[:10],
            )

    @classmethod
    def _date_queue_rows_after_their_events(
        cls, rows: list[tuple[int, str]], events: list[DatasetEvent], session: Session
    ) -> None:
        """
        MySQL/MariaDB, SQLite: date the queue rows this transaction took or wrote one microsecond after its events'
        stamps, ``max(created_at + 1 microsecond, ..)`` on MySQL/MariaDB, where a taken row is written here only.
        """
        from datetime import timedelta

        from sqlalchemy import inspect

        after: dict[int, datetime] = {}
        for dataset_event in events:
            if inspect(dataset_event).persistent:
                stamp = dataset_event.timestamp + timedelta(microseconds=1)
                after[dataset_event.dataset_id] = max(after.get(dataset_event.dataset_id, stamp), stamp)
        rows = [row for row in rows if row[0] in after]  # this transaction's, locked already: no wait
        if not rows:
            return
        # By primary key, executemany.
        greatest = (
            "GREATEST(TIMESTAMPADD(MICROSECOND, 1, created_at), CAST(%(after)s AS DATETIME(6)))"
            if session.bind.dialect.name == "mysql"
            else "max(created_at, %(after)s)"
        )
        cls._send(
            session,
            f"UPDATE dataset_dag_run_queue SET created_at = {greatest} "
            "WHERE dataset_id = %(dataset_id)s AND target_dag_id = %(dag_id)s",
            [
                {
                    "after": cls._utc_text(after[dataset_id]),
                    "dataset_id": dataset_id,
                    "dag_id": dag_id,
                }
                for dataset_id, dag_id in rows
            ],
        )

    @classmethod
    def _upsert_queue_rows_not_held(
        cls, rows: list[tuple[int, str]], events: list[DatasetEvent], session: Session
    ) -> set[tuple[int, str]]:
        """
        Upsert the queue rows among ``rows`` that no other transaction holds, in that order; return the held keys. A
        row gets ``max(now, stored + 1 microsecond)``: always changed, so a scheduler that read it before leaves it.
        Only rows of DAGs that still exist, read without a lock (``FOR KEY SHARE`` would wait for a scheduler loop):
        ``delete_dag`` no longer waits for the producer.
        """
        dialect_name = session.bind.dialect.name
        if dialect_name == "postgresql":
            busy = cls._postgres_upsert_queue_rows(rows, events, session)
        elif dialect_name == "mysql":
            busy = cls._upsert_queue_rows_taken_first(rows, events, session)
        else:
            busy = set()
            cls._sqlite_upsert_queue_rows(rows, session)
        return busy

    @classmethod
    def _postgres_upsert_queue_rows(
        cls, rows: list[tuple[int, str]], events: list[DatasetEvent], session: Session
    ) -> set[tuple[int, str]]:
        """
        PostgreSQL: take the existing rows among ``rows`` without waiting, insert the keys with no row whose DAG
        exists, in key order; return the keys held by another transaction. Two short statements a chunk (a task's
        connection is new, and a new server backend plans a statement of CTEs and joins for milliseconds; issue 30);
        only when a key was neither taken nor inserted, a second take of those keys and then the look for held rows.
        A taken row of a dataset with an event here is only locked: a second write of a row would check its foreign
        key again, waiting for a scheduler loop holding its DAG's row; ``_postgres_stamp_events_and_date_queue_rows``
        writes it, once.
        """
        from sqlalchemy import inspect

        clock = cls._database_clock("postgresql")
        stamped = {e.dataset_id for e in events if inspect(e).persistent}

        def queue_rows_named(keys: list[tuple[int, str]], lock: bool) -> set[tuple[int, str]]:
            """The keys among ``keys`` that have a committed row (``lock``: that this transaction could lock)."""
            pairs, params = cls._postgres_row_in_list(keys)
            statement = (
                "SELECT q.dataset_id, q.target_dag_id FROM dataset_dag_run_queue AS q "
                f"WHERE (q.dataset_id, q.target_dag_id) IN ({pairs})" + (" FOR UPDATE SKIP LOCKED" if lock else "")
            )
            return set(map(tuple, cls._send(session, statement, params)))

        def insert_new_keys(keys: list[tuple[int, str]]) -> set[tuple[int, str]]:
            """Insert the keys among ``keys`` with no committed row and a DAG; return those written."""
            # Both read without a lock (delete_dag does not wait for the producer), as scalar subqueries: one
            # primary-key probe per key whatever the statistics (NOT EXISTS may be planned as a scan of the queue). A
            # key another producer inserts at once is waited for, in key order (ORDER BY), and then left (DO NOTHING,
            # which a new backend plans 0.15 ms faster than DO UPDATE): the caller takes it.
            values = ", ".join(
                f"(CAST(%(dataset_id_{i})s AS INTEGER), CAST(%(dag_id_{i})s AS VARCHAR))" for i in range(len(keys))
            )
            # The ORDER BY orders the waits of two keys or more; one key has none to order (and plans 0.09 ms faster).
            order = " ORDER BY k.dataset_id, k.target_dag_id" if len(keys) > 1 else ""
            statement = (
                "INSERT INTO dataset_dag_run_queue (dataset_id, target_dag_id, created_at) SELECT k.dataset_id, "
                f"k.target_dag_id, {clock} FROM (VALUES {values}) AS k(dataset_id, "
                "target_dag_id) WHERE (SELECT 1 FROM dataset_dag_run_queue AS q WHERE q.dataset_id = k.dataset_id "
                "AND q.target_dag_id = k.target_dag_id) IS NULL AND (SELECT 1 FROM dag WHERE dag.dag_id = "
                f"k.target_dag_id) IS NOT NULL{order} ON CONFLICT DO NOTHING RETURNING dataset_id, target_dag_id"
            )
            return set(map(tuple, cls._send(session, statement, cls._postgres_row_in_list(keys)[1])))

        busy: set[tuple[int, str]] = set()
        for start in range(0, len(rows), 500):
            chunk = rows[start : start + 500]
            taken = queue_rows_named(chunk, lock=True)
            if new := [key for key in chunk if key not in taken]:
                inserted = insert_new_keys(new)
                # Inserted by another producer since the take (committed before the insert, or waited for by it):
                # taken now. The rest are held by another transaction, or gone (their DAG deleted, or the row deleted
                # by a scheduler just now: its event waits for the sweep, as when the look found a row gone).
                if left := [key for key in new if key not in inserted]:
                    taken |= queue_rows_named(left, lock=True)
                    if left := [key for key in left if key not in taken]:
                        busy.update(queue_rows_named(left, lock=False))
            if unstamped := sorted(key for key in taken if key[0] not in stamped):  # no event to date it after
                pairs, params = cls._postgres_row_in_list(unstamped)
                cls._send(
                    session,
                    "UPDATE dataset_dag_run_queue SET created_at = GREATEST(created_at + interval '1 microsecond', "
                    f"{clock}) WHERE (dataset_id, target_dag_id) IN ({pairs})",
                    params,
                )
        return busy

    @staticmethod
    def _postgres_row_in_list(keys: list[tuple[int, str]], start: int = 0) -> tuple[str, dict[str, object]]:
        """
        PostgreSQL: the terms ``(%(dataset_id_i)s, %(dag_id_i)s), ..`` of a row IN list of ``keys`` from ``start``,
        and their parameters (``_send``'s placeholders).
        """
        params: dict[str, object] = {}
        for i, (dataset_id, dag_id) in enumerate(keys, start):
            params[f"dataset_id_{i}"], params[f"dag_id_{i}"] = dataset_id, dag_id
        return ", ".join(f"(%(dataset_id_{i})s, %(dag_id_{i})s)" for i in range(start, start + len(keys))), params

    @classmethod
    def _upsert_queue_rows_taken_first(
        cls, rows: list[tuple[int, str]], events: list[DatasetEvent], session: Session
    ) -> set[tuple[int, str]]:
        """
        MySQL/MariaDB: take the existing rows among ``rows``, then upsert in key order those not busy whose DAG exists,
        but a taken row of a dataset with an event, which ``_date_queue_rows_after_their_events`` writes once. Return the busy
        keys. Short statements, not one: a task's connection is new (Airflow disposes the pool before the task runs)
        and the server plans each statement with cold caches (issue 30).
        """
        from sqlalchemy import inspect

        dialect = session.bind.dialect
        clock = cls._database_clock(dialect.name)
        # MySQL 8.0.19+ names the new row with an alias (VALUES() is deprecated: 1287); MariaDB has only VALUES()
        alias = not dialect.is_mariadb and dialect.server_version_info >= (8, 0, 19)
        new_created_at = "new.created_at" if alias else "VALUES(created_at)"
        upsert = (
            (" AS new" if alias else "")
            + f" ON DUPLICATE KEY UPDATE created_at = GREATEST({new_created_at}, "
            "TIMESTAMPADD(MICROSECOND, 1, dataset_dag_run_queue.created_at))"
        )
        taken, busy, live = cls._take_queue_rows(rows, session)
        stamped = {e.dataset_id for e in events if inspect(e).persistent}
        rows = [
            row for row in rows
            if row[1] in live and row not in busy and not (row in taken and row[0] in stamped)
        ]
        for start in range(0, len(rows), 500):  # 500 rows a statement: far below max_allowed_packet
            chunk = rows[start : start + 500]
            cls._send(
                session,
                "INSERT INTO dataset_dag_run_queue (dataset_id, target_dag_id, created_at) VALUES "
                + ", ".join(f"(%(dataset_id_{i})s, %(dag_id_{i})s, {clock})" for i in range(len(chunk)))
                + upsert,
                {
                    **{f"dataset_id_{i}": row[0] for i, row in enumerate(chunk)},
                    **{f"dag_id_{i}": row[1] for i, row in enumerate(chunk)},
                },
            )
        return busy

    @classmethod
    def _sqlite_upsert_queue_rows(cls, rows: list[tuple[int, str]], session: Session) -> None:
        """SQLite: upsert the queue rows ``rows`` (a writer excludes the others: none is held)."""
        from sqlalchemy import bindparam, text

        from airflow.utils import timezone
        from airflow.utils.sqlalchemy import UtcDateTime

        now = timezone.utcnow()  # SQLite: this host's clock is the database's
        # Stored as 'YYYY-MM-DD HH:MM:SS.ffffff' text: one microsecond on in integer arithmetic (julianday() is too
        # coarse), the format kept so text compares chronologically; no microseconds or a '+00:00' suffix: .000000.
        micros = (
            "(strftime('%s', substr(dataset_dag_run_queue.created_at, 1, 19)) * 1000000"
            " + CASE WHEN substr(dataset_dag_run_queue.created_at, 20, 1) = '.'"
            " THEN CAST(substr(dataset_dag_run_queue.created_at, 21, 6) AS INTEGER) ELSE 0 END + 1)"
        )
        successor = (
            f"strftime('%Y-%m-%d %H:%M:%S', {micros} / 1000000, 'unixepoch') || printf('.%06d', {micros} % 1000000)"
        )
        # Text, executed once per row (executemany): an ORM insert built per COMMIT cost more than running it.
        upsert = text(
            "INSERT INTO dataset_dag_run_queue (dataset_id, target_dag_id, created_at) "
            "VALUES (:dataset_id, :dag_id, :now) ON CONFLICT (dataset_id, target_dag_id) "
            f"DO UPDATE SET created_at = max(excluded.created_at, {successor})"
        ).bindparams(bindparam("now", type_=UtcDateTime))
        if rows:
            session.execute(upsert, [{"dataset_id": row[0], "dag_id": row[1], "now": now} for row in rows])
