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

The single source of truth: the import-time shim installs these members on Airflow's class and
``patches/`` are generated from this text. Write them as Airflow code: every global they use must
name the same object in ``airflow.datasets.manager`` (tests check it); import the rest inside.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from airflow.api_internal.internal_api_call import internal_api_call
from airflow.configuration import conf
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
from sqlalchemy import exc, select
from sqlalchemy.orm import joinedload

if TYPE_CHECKING:
    from datetime import datetime

    from airflow.datasets import Dataset
    from airflow.models.dag import DagModel
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy.orm.session import Session, SessionTransaction


class DatasetManager:
    """Mirror of ``airflow.datasets.manager.DatasetManager``: only the members the fix changes."""

    @staticmethod
    def _dataset_race_fix_settings() -> dict[str, int | float]:
        """``[dataset_race_fix]`` settings and their defaults; what each means: docs/settings.md."""
        return {
            "commit_latency_seconds": 3,
            "event_lookback_seconds": 900,
            "max_event_ahead_seconds": 60,
            "net_look_interval_seconds": 0.5,
            "queue_row_wait_seconds": 0.0,
            "requeue_interval_seconds": 10.0,
        }

    @classmethod
    def _dataset_race_fix_setting(cls, key: str, _read: dict = {}) -> int | float:  # noqa: B006 (the process's reads)
        """``[dataset_race_fix] key``, never below 0, read once a process and when its environment variable
        changes (Airflow's conf read, 10-30 µs, twice a scheduler loop, was its largest fixed part)."""
        from os import environ

        variable = environ.get(f"AIRFLOW__DATASET_RACE_FIX__{key.upper()}")
        if (key, variable) not in _read:  # an int, or a float where the default is one
            default = cls._dataset_race_fix_settings()[key]
            read = conf.getfloat if isinstance(default, float) else conf.getint
            _read[key, variable] = max(0, read("dataset_race_fix", key, fallback=default))
        return _read[key, variable]

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
        queued_dag_ids = [r for r in queued_results if r is not None]
        if queued_dag_ids:
            cls.logger().debug("consuming dag ids %s", queued_dag_ids)

    @classmethod
    def _postgres_queue_dagruns(cls, dataset_id: int, dags_to_queue: set[DagModel], session: Session) -> None:
        cls._defer_queue_dagruns(dataset_id, dags_to_queue, session)

    @classmethod
    def _defer_queue_dagruns(cls, dataset_id: int, dags_to_queue: set[DagModel], session: Session) -> None:
        """Remember an event's queue rows for ``_write_at_commit``, each with its (sub)transaction."""
        deferred = session.info.setdefault("airflow_dataset_race_fix.deferred_queue_rows", {})
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
        """
        ``before_commit`` of the outermost transaction, its last statements (BUG_REPORT section 4): upsert the
        queue rows of DAGs that exist to ``max(now, stored + 1 microsecond)`` but those held by others (their
        DAGs stay queued), then stamp the events. Lock order: taking existing rows never waits and new keys go
        in key order, so producers form no cycle; polling, not a lock wait with a timeout, which could (1213).
        """
        import time

        from sqlalchemy import inspect

        if session.in_nested_transaction():
            return
        deferred = session.info.get("airflow_dataset_race_fix.deferred_queue_rows")
        events = session.info.get("airflow_dataset_race_fix.events_to_stamp")
        if not deferred and not events:
            return
        session.flush()  # the transaction's other writes first: these are its last
        events = [e for e in events or [] if inspect(e).persistent]  # a rolled back SAVEPOINT's have left
        rows = sorted(deferred or {})
        upsert = {
            "postgresql": cls._postgres_upsert_queue_rows,
            "mysql": cls._upsert_queue_rows_taken_first,
        }.get(session.bind.dialect.name, cls._sqlite_upsert_queue_rows)
        busy = upsert(rows, events, session)
        deadline = time.monotonic() + (cls._dataset_race_fix_setting("queue_row_wait_seconds") if busy else 0)
        pause = 0.001  # a producer's COMMIT holds a row for milliseconds: look again soon, then less often
        while busy and time.monotonic() < deadline:  # the last look at the deadline: the whole wait is polled
            time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
            pause = min(2 * pause, 0.008)
            busy = upsert(sorted(busy), events, session)
        # Every row locked before the stamps: the floor.
        cls._stamp_events_and_date_queue_rows(events, [row for row in rows if row not in busy], session)
        if busy:
            Stats.incr("dataset_race_fix.busy_queue_rows_left_out", len(busy))
            cls.logger().info(
                "%d dataset queue row(s) held by another transaction past [dataset_race_fix] "
                "queue_row_wait_seconds left as they are (the DAGs stay queued by them): %s",
                len(busy),
                sorted(busy)[:10],
            )
        # only once written: a failure retries
        session.info.pop("airflow_dataset_race_fix.deferred_queue_rows", None)
        session.info.pop("airflow_dataset_race_fix.events_to_stamp", None)

    @classmethod
    def _forget_rolled_back_queue_rows(
        cls, session: Session, previous_transaction: SessionTransaction
    ) -> None:
        """``after_soft_rollback``: forget the rows registered in the rolled back (sub)transaction."""
        deferred = session.info.get("airflow_dataset_race_fix.deferred_queue_rows")
        for key, transaction in list((deferred or {}).items()):
            while transaction is not None and transaction is not previous_transaction:
                transaction = transaction.parent
            if transaction is not None:
                del deferred[key]

    @classmethod
    def _forget_ended_queue_rows(cls, session: Session, transaction: SessionTransaction) -> None:
        """``after_transaction_end``: nothing outlives the outermost transaction (a close(), no commit)."""
        if transaction.parent is None:
            session.info.pop("airflow_dataset_race_fix.deferred_queue_rows", None)
            session.info.pop("airflow_dataset_race_fix.events_to_stamp", None)

    @classmethod
    def _database_clock(cls, dialect_name: str) -> str | None:
        """SQL of the clock dating events, queue rows and runs; None: this host's (SQLite). Tests vary it."""
        return {"postgresql": "clock_timestamp()", "mysql": "NOW(6)"}.get(dialect_name)

    @classmethod
    def _database_now(cls, session: Session) -> datetime:
        """The database's clock, now (see ``_database_clock``)."""
        from airflow.utils import timezone
        from airflow.utils.sqlalchemy import UtcDateTime
        from sqlalchemy import literal_column

        clock = cls._database_clock(session.bind.dialect.name)
        return (
            timezone.utcnow() if clock is None else session.scalar(select(literal_column(clock, UtcDateTime)))
        )

    @staticmethod
    def _send(session: Session, statement: str, params: dict[str, object] | list[dict[str, object]]):
        """``statement`` as written, placeholders ``%(name)s``; a parameter list: executemany."""
        import re

        if session.bind.dialect.name == "sqlite":
            statement = re.sub(r"%\((\w+)\)s", r":\1", statement)
        return session.connection().exec_driver_sql(statement, params)

    @classmethod
    def _stamp_events_and_date_queue_rows(
        cls, events: list[DatasetEvent], rows: list[tuple[int, str]], session: Session
    ) -> None:
        """
        Date ``events`` on the database's clock, forward-only per dataset (BUG_REPORT section 4), then
        ``rows`` (held already: no wait) a microsecond after them. PostgreSQL: one statement, stamps returned.
        """
        from datetime import datetime, timedelta

        from airflow.utils import timezone
        from airflow.utils.sqlalchemy import UtcDateTime
        from sqlalchemy.orm.attributes import set_committed_value

        if not events:
            return
        dialect = session.bind.dialect
        clock = cls._database_clock(dialect.name)
        ahead = timedelta(seconds=cls._dataset_race_fix_setting("max_event_ahead_seconds"))

        def as_utc(value: datetime | str | None) -> datetime | None:  # SQLite's driver returns text
            value = datetime.fromisoformat(value) if isinstance(value, str) else value
            return UtcDateTime().process_result_value(value, dialect)

        if dialect.name == "postgresql":
            by_id = {e.id: e for e in events}
            stamped = {e.dataset_id for e in events}
            rows = [row for row in rows if row[0] in stamped]
            params: dict[str, object] = {"ahead": ahead}
            if len(by_id) == 1:  # one event: its SET reads the clock, its stamp dates rows (0.3 ms less plan)
                (params["event_id"],) = by_id
                this, other = "e.id = %(event_id)s", "o.id <> %(event_id)s"
                now, clock_once, newest = clock, [], []
                stamp_of_row = "(SELECT s.timestamp FROM stamped AS s)"
            else:  # one clock for all the events: a WITH query holding a volatile function is evaluated once
                params["event_ids"] = sorted(by_id)
                ids = "CAST(%(event_ids)s AS INTEGER[])"
                this, other = f"e.id = ANY({ids})", f"o.id <> ALL({ids})"
                now, clock_once = "c.now", [f"c AS (SELECT {clock} AS now)"]
                newest = [
                    "newest AS (SELECT dataset_id, max(timestamp) AS stamp FROM stamped GROUP BY dataset_id)"
                ]
                stamp_of_row = "(SELECT n.stamp FROM newest AS n WHERE n.dataset_id = q.dataset_id)"
            # The newest other event + 1 µs if below the clock + ahead (GREATEST skips NULL), else the clock
            parts = [
                *clock_once,
                f"stamped AS (UPDATE dataset_event AS e SET timestamp = COALESCE((SELECT GREATEST({now}, "
                f"CASE WHEN o.timestamp < {now} + CAST(%(ahead)s AS INTERVAL) THEN o.timestamp + "
                "interval '1 microsecond' END) FROM dataset_event AS o WHERE o.dataset_id = e.dataset_id "
                f"AND {other} ORDER BY o.timestamp DESC LIMIT 1), {now}){' FROM c' if clock_once else ''} "
                f"WHERE {this} RETURNING e.id, e.dataset_id, e.timestamp)",
                *newest,
            ]
            for start in range(0, len(rows), 500):  # a row IN list: one primary-key probe per row
                pairs, keys = cls._row_in_list(rows[start : start + 500], start)
                params.update(keys)
                parts.append(
                    f"dated_{start} AS (UPDATE dataset_dag_run_queue AS q SET created_at = GREATEST("
                    f"q.created_at + interval '1 microsecond', {stamp_of_row} + interval '1 microsecond') "
                    f"WHERE (q.dataset_id, q.target_dag_id) IN ({pairs}))"
                )
            statement = f"WITH {', '.join(parts)} SELECT id, timestamp FROM stamped"
            for event_id, stamp in cls._send(session, statement, params):
                set_committed_value(by_id[event_id], "timestamp", as_utc(stamp))
            return

        def utc_text(stamp: datetime) -> str:  # MySQL's DATETIME(6), SQLite's text as Airflow's: in order
            return stamp.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")

        by_dataset: dict[int, list[DatasetEvent]] = {}
        for dataset_event in events:
            by_dataset.setdefault(dataset_event.dataset_id, []).append(dataset_event)

        def ids_in(name: str, dataset_id: int) -> tuple[str, dict[str, object]]:  # (%(name_0)s, ..), params
            placeholders = ", ".join(f"%({name}_{i})s" for i in range(len(by_dataset[dataset_id])))
            return f"({placeholders})", {f"{name}_{i}": e.id for i, e in enumerate(by_dataset[dataset_id])}

        dataset_ids = sorted(by_dataset)
        stamps: dict[int, datetime] = {}
        for start in range(0, len(dataset_ids), 100):
            chunk = dataset_ids[start : start + 100]
            params = {}
            newest_other = f"SELECT {clock or 'NULL'}"  # SQLite: this host's clock, read below
            for i, dataset_id in enumerate(chunk):
                ids, id_params = ids_in(f"event_id_{i}", dataset_id)
                params.update(id_params, **{f"dataset_id_{i}": dataset_id})
                newest_other += (
                    f", (SELECT timestamp FROM dataset_event WHERE dataset_id = %(dataset_id_{i})s "
                    f"AND id NOT IN {ids} ORDER BY timestamp DESC LIMIT 1)"
                )
            now, *newest_timestamps = map(as_utc, cls._send(session, newest_other, params).one())
            now = timezone.utcnow() if clock is None else now
            for dataset_id, newest_timestamp in zip(chunk, newest_timestamps):
                after = newest_timestamp and newest_timestamp + timedelta(microseconds=1)
                stamp = stamps[dataset_id] = after if after and now < after <= now + ahead else now  # not far
                ids, params = ids_in("event_id", dataset_id)
                params["stamp"] = utc_text(stamp)
                cls._send(
                    session, f"UPDATE dataset_event SET timestamp = %(stamp)s WHERE id IN {ids}", params
                )
                for dataset_event in by_dataset[dataset_id]:
                    set_committed_value(dataset_event, "timestamp", stamp)
        rows = [row for row in rows if row[0] in stamps]
        if rows:
            greatest = "max(created_at, %(after)s)"
            if dialect.name == "mysql":  # a taken row is written here only: after its stored value too
                greatest = (
                    "GREATEST(TIMESTAMPADD(MICROSECOND, 1, created_at), CAST(%(after)s AS DATETIME(6)))"
                )
            dated = {
                dataset_id: utc_text(stamp + timedelta(microseconds=1))
                for dataset_id, stamp in stamps.items()
            }
            cls._send(
                session,
                f"UPDATE dataset_dag_run_queue SET created_at = {greatest} "
                "WHERE dataset_id = %(dataset_id)s AND target_dag_id = %(dag_id)s",
                [{"after": dated[row[0]], "dataset_id": row[0], "dag_id": row[1]} for row in rows],
            )

    @classmethod
    def _take_queue_rows(cls, rows: list[tuple[int, str]], session: Session) -> tuple[set, set, set[str]]:
        """MySQL/MariaDB: (the rows of ``rows`` taken without waiting, those others hold, the live DAGs)."""
        from sqlalchemy import bindparam, text

        dialect = session.bind.dialect
        skip_locked = (10, 6) if dialect.is_mariadb else (8, 0, 1)
        if (dialect.server_version_info or ()) < skip_locked:  # no SKIP LOCKED: upsert all, waiting as stock
            dag_ids = sorted({dag_id for _, dag_id in rows})
            existing = text("SELECT dag_id FROM dag WHERE dag_id IN :ids").bindparams(
                bindparam("ids", expanding=True)
            )
            live = set()
            for start in range(0, len(dag_ids), 500):
                live.update(session.scalars(existing, {"ids": dag_ids[start : start + 500]}))
            return set(), set(), live

        taken, busy, live = set(), set(), set()
        for start in range(0, len(rows), 500):
            chunk = rows[start : start + 500]
            source, params = cls._queue_keys_joined_first(chunk)  # one primary-key probe per key
            take = f"SELECT q.dataset_id, q.target_dag_id FROM {source} FOR UPDATE SKIP LOCKED"
            taken_here = set(map(tuple, cls._send(session, take, params)))
            taken.update(taken_here)
            # A taken row's DAG exists to this COMMIT (deleting the DAG deletes the row, which this one holds)
            live.update(dag_id for _, dag_id in taken_here)
            if len(taken_here) < len(chunk):
                source, params = cls._queue_keys_joined_first(
                    [k for k in chunk if k not in taken_here], "LEFT JOIN"
                )
                look = (
                    "SELECT k.dataset_id, k.target_dag_id, q.dataset_id IS NOT NULL, "
                    f"EXISTS (SELECT 1 FROM dag WHERE dag.dag_id = k.target_dag_id) FROM {source}"
                )
                looked = cls._send(session, look, params).all()
                busy.update((dataset_id, dag_id) for dataset_id, dag_id, held, _ in looked if held)
                live.update(dag_id for _, dag_id, _, dag_exists in looked if dag_exists)
        return taken, busy, live

    @classmethod
    def _queue_keys_joined_first(
        cls, keys: list[tuple[int, str]], join: str = "STRAIGHT_JOIN"
    ) -> tuple[str, dict]:
        """MySQL/MariaDB: a FROM clause, keys ``k`` ``join`` queue rows ``q`` by primary key; parameters."""
        derived = " UNION ALL ".join(
            f"SELECT %(dataset_id_{i})s AS dataset_id, %(dag_id_{i})s AS target_dag_id"
            for i in range(len(keys))
        )
        return (
            f"({derived}) AS k {join} dataset_dag_run_queue AS q FORCE INDEX (PRIMARY) "
            "ON q.dataset_id = k.dataset_id AND q.target_dag_id = k.target_dag_id",
            cls._row_in_list(keys)[1],
        )

    @classmethod
    def _postgres_upsert_queue_rows(
        cls, rows: list[tuple[int, str]], events: list[DatasetEvent], session: Session
    ) -> set[tuple[int, str]]:
        """
        PostgreSQL: take the existing rows of ``rows`` without waiting, insert the new keys whose DAG exists;
        return those held by others. A taken row of a stamped dataset is only locked (the stamp's statement
        writes it, once): a second write would check its foreign key again, waiting for a scheduler loop.
        """
        clock = cls._database_clock("postgresql")
        stamped = {e.dataset_id for e in events}

        def queue_rows_named(keys: list[tuple[int, str]], lock: bool) -> set[tuple[int, str]]:
            pairs, params = cls._row_in_list(keys)
            statement = (
                "SELECT q.dataset_id, q.target_dag_id FROM dataset_dag_run_queue AS q "
                f"WHERE (q.dataset_id, q.target_dag_id) IN ({pairs})"
                + (" FOR UPDATE SKIP LOCKED" if lock else "")
            )
            return set(map(tuple, cls._send(session, statement, params)))

        busy: set[tuple[int, str]] = set()
        for start in range(0, len(rows), 500):
            chunk = rows[start : start + 500]
            taken = queue_rows_named(chunk, lock=True)
            new = [key for key in chunk if key not in taken]
            if new:
                # Scalar subqueries: a primary-key probe per key. A key another producer inserts at once is
                # waited for in key order (ORDER BY, needless for one), left (DO NOTHING), taken below.
                values = ", ".join(
                    f"(CAST(%(dataset_id_{i})s AS INTEGER), CAST(%(dag_id_{i})s AS VARCHAR))"
                    for i in range(len(new))
                )
                order = " ORDER BY k.dataset_id, k.target_dag_id" if len(new) > 1 else ""
                insert = (
                    "INSERT INTO dataset_dag_run_queue (dataset_id, target_dag_id, created_at) "
                    f"SELECT k.dataset_id, k.target_dag_id, {clock} FROM (VALUES {values}) "
                    "AS k(dataset_id, target_dag_id) WHERE (SELECT 1 FROM dataset_dag_run_queue AS q "
                    "WHERE q.dataset_id = k.dataset_id AND q.target_dag_id = k.target_dag_id) IS NULL "
                    "AND (SELECT 1 FROM dag WHERE dag.dag_id = k.target_dag_id) IS NOT NULL"
                    f"{order} ON CONFLICT DO NOTHING RETURNING dataset_id, target_dag_id"
                )
                inserted = set(map(tuple, cls._send(session, insert, cls._row_in_list(new)[1])))
                # Not inserted: another's since the take (taken now), held, or gone (its event awaits a sweep)
                left = [key for key in new if key not in inserted]
                if left:
                    taken |= queue_rows_named(left, lock=True)
                    left = [key for key in left if key not in taken]
                    if left:
                        busy.update(queue_rows_named(left, lock=False))
            unstamped = sorted(key for key in taken if key[0] not in stamped)  # no event to date it after
            if unstamped:
                pairs, params = cls._row_in_list(unstamped)
                cls._send(
                    session,
                    "UPDATE dataset_dag_run_queue SET created_at = "
                    f"GREATEST(created_at + interval '1 microsecond', {clock}) "
                    f"WHERE (dataset_id, target_dag_id) IN ({pairs})",
                    params,
                )
        return busy

    @staticmethod
    def _row_in_list(keys: list[tuple[int, str]], start: int = 0) -> tuple[str, dict[str, object]]:
        """``(%(dataset_id_i)s, %(dag_id_i)s), ..`` for ``keys``, numbered from ``start``, and parameters."""
        params: dict[str, object] = {}
        for i, (dataset_id, dag_id) in enumerate(keys, start):
            params[f"dataset_id_{i}"], params[f"dag_id_{i}"] = dataset_id, dag_id
        return ", ".join(
            f"(%(dataset_id_{i})s, %(dag_id_{i})s)" for i in range(start, start + len(keys))
        ), params

    @classmethod
    def _upsert_queue_rows_taken_first(
        cls, rows: list[tuple[int, str]], events: list[DatasetEvent], session: Session
    ) -> set[tuple[int, str]]:
        """MySQL/MariaDB: take, then upsert what is free, but a taken row of a stamped dataset; the held."""
        dialect = session.bind.dialect
        clock = cls._database_clock(dialect.name)
        # MySQL 8.0.19+ names the new row with an alias (VALUES() is deprecated: 1287); MariaDB: VALUES() only
        alias = not dialect.is_mariadb and dialect.server_version_info >= (8, 0, 19)
        row_alias, new_created_at = (" AS new", "new.created_at") if alias else ("", "VALUES(created_at)")
        upsert = (
            f"{row_alias} ON DUPLICATE KEY UPDATE created_at = GREATEST({new_created_at}, "
            "TIMESTAMPADD(MICROSECOND, 1, dataset_dag_run_queue.created_at))"
        )
        taken, busy, live = cls._take_queue_rows(rows, session)
        stamped = {e.dataset_id for e in events}
        rows = [
            row
            for row in rows
            if row[1] in live and row not in busy and not (row in taken and row[0] in stamped)
        ]
        for start in range(0, len(rows), 500):  # 500 rows a statement: far below max_allowed_packet
            chunk = rows[start : start + 500]
            cls._send(
                session,
                "INSERT INTO dataset_dag_run_queue (dataset_id, target_dag_id, created_at) VALUES "
                + ", ".join(f"(%(dataset_id_{i})s, %(dag_id_{i})s, {clock})" for i in range(len(chunk)))
                + upsert,
                cls._row_in_list(chunk)[1],
            )
        return busy

    @classmethod
    def _sqlite_upsert_queue_rows(cls, rows: list[tuple[int, str]], events: list, session: Session) -> set:
        """SQLite: upsert ``rows``, a text() executemany (cheaper than ORM inserts); one writer at a time."""
        from airflow.utils import timezone
        from airflow.utils.sqlalchemy import UtcDateTime
        from sqlalchemy import bindparam, text

        # Stored as 'YYYY-MM-DD HH:MM:SS.ffffff' text: one microsecond on in integer arithmetic (julianday()
        # is too coarse), the format kept so text compares in time order; no microseconds, '+00:00': .000000.
        micros = (
            "(strftime('%s', substr(dataset_dag_run_queue.created_at, 1, 19)) * 1000000"
            " + CASE WHEN substr(dataset_dag_run_queue.created_at, 20, 1) = '.'"
            " THEN CAST(substr(dataset_dag_run_queue.created_at, 21, 6) AS INTEGER) ELSE 0 END + 1)"
        )
        seconds = f"strftime('%Y-%m-%d %H:%M:%S', {micros} / 1000000, 'unixepoch')"
        successor = f"{seconds} || printf('.%06d', {micros} % 1000000)"
        upsert = text(
            "INSERT INTO dataset_dag_run_queue (dataset_id, target_dag_id, created_at) "
            "VALUES (:dataset_id, :dag_id, :now) ON CONFLICT (dataset_id, target_dag_id) "
            f"DO UPDATE SET created_at = max(excluded.created_at, {successor})"
        ).bindparams(bindparam("now", type_=UtcDateTime))
        if rows:
            now = timezone.utcnow()  # SQLite: this host's clock is the database's
            session.execute(upsert, [{"dataset_id": row[0], "dag_id": row[1], "now": now} for row in rows])
        return set()
