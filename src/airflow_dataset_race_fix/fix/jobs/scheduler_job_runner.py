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
# Modified by the airflow-dataset-race-fix project: the members below are
# airflow.jobs.scheduler_job_runner.SchedulerJobRunner._create_dagruns_for_dags and
# _create_dag_runs_dataset_triggered (Airflow 2.10.4), kept as small diffs of the
# originals, and members the fix adds.
"""
The scheduler side of the fix: a dataset-triggered run consumes what its DAG has not consumed yet.

Per DAG the loop decides (``_decide_dataset_triggered_runs``, read-only, which explain runs too):
read the state, a floor per dataset (``_dataset_floors``), the events above it that no run of the
DAG consumed, and the run they make (``_choose_dataset_run``). The queue rows read are deleted
exactly as read at the end of the loop (``_delete_dataset_queue_rows_as_read``). The sweep
(``_dags_with_unqueued_dataset_events``) brings in DAGs whose new events have no queue row, and the
net (``_dags_with_stranded_dataset_events``) late commits below a DAG's latest run. Why: BUG_REPORT.md
section 4 ("Scheduler: consume what is unconsumed", "Lock discipline", "A stalled producer") and
section 6 ("The floor", "The net"). Settings: ``DatasetManager._dataset_race_fix_settings``.

Nothing here commits: all of it is in the scheduler's own transaction, as before.
Every global below must name the same object in ``airflow.jobs.scheduler_job_runner``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Collection

from sqlalchemy import and_, delete, func, or_, select

from airflow.models.dag import DagModel
from airflow.models.dagrun import DagRun
from airflow.models.dataset import (
    DagScheduleDatasetReference,
    DatasetDagRunQueue,
    DatasetEvent,
    DatasetModel,
)
from airflow.stats import Stats
from airflow.timetables.simple import DatasetTriggeredTimetable
from airflow.utils import timezone
from airflow.utils.retries import retry_db_transaction
from airflow.utils.sqlalchemy import with_row_locks
from airflow.utils.state import DagRunState
from airflow.utils.types import DagRunType

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.orm import Session

    from airflow.utils.sqlalchemy import CommitProhibitorGuard


class SchedulerJobRunner:
    """Mirror of ``airflow.jobs.scheduler_job_runner.SchedulerJobRunner``: only the fixed members."""

    @retry_db_transaction
    def _create_dagruns_for_dags(self, guard: CommitProhibitorGuard, session: Session) -> None:
        """Find Dag Models needing DagRuns and Create Dag Runs with retries in case of OperationalError."""
        query, dataset_triggered_dag_info = DagModel.dags_needing_dagruns(session)
        all_dags_needing_dag_runs = set(query.all())
        dataset_triggered_dags = [
            dag for dag in all_dags_needing_dag_runs if dag.dag_id in dataset_triggered_dag_info
        ]
        non_dataset_dags = all_dags_needing_dag_runs.difference(dataset_triggered_dags)
        self._create_dag_runs(non_dataset_dags, session)
        # and the DAGs whose new events have no queue row (the sweep): decided the same way
        dataset_triggered_dags += self._dags_with_unqueued_dataset_events(dataset_triggered_dag_info, session)
        if dataset_triggered_dags:
            self._create_dag_runs_dataset_triggered(
                dataset_triggered_dags, dataset_triggered_dag_info, session
            )

        # commit the session - Release the write lock on DagModel table.
        guard.commit()
        # END: create dagruns

    @staticmethod
    def _dataset_manager() -> Any:
        """Airflow's DatasetManager, whose fixed members give these steps their clock and settings (explain: the fix's)."""
        from airflow.datasets.manager import DatasetManager

        return DatasetManager

    @dataclass(frozen=True)
    class _DatasetFloors:
        """Where a DAG's read of its events starts (``_dataset_floors``)."""

        floors: dict[int, datetime]  # per dataset; empty for a DAG's first run (every event)
        runs_floor: datetime | None  # its runs from here on hold what it consumed; None: first run
        full_read: bool  # every dataset read from the whole look-back window

    @dataclass
    class _DatasetEventRead:
        """An event as the decision reads it: the columns it counts and dates by, no ORM object (issue 49)."""

        id: int
        dataset_id: int
        timestamp: datetime
        source_dag_id: str | None
        source_run_id: str | None
        source_dag_run: Any = None  # the producer's run, for a run's events only (``_events_for_timetable``)

    @dataclass(frozen=True)
    class _DatasetRunChoice:
        """What a DAG's events decide (``_choose_dataset_run``)."""

        events: list[Any]  # what its run consumes: dated up to the horizon
        deferred: list[Any]  # dated beyond the horizon: they wait
        late: list[Any]  # dated before its latest run
        execution_date: datetime | None  # before the unique-date check; None: no run
        rows_done: tuple[int, ...]  # datasets whose queue rows are deleted (as read)
        old_serialization: bool = False  # its condition cannot be evaluated: skipped

    @dataclass(frozen=True)
    class _DatasetDecisionState:
        """What ``_decide_dataset_triggered_runs`` reads for all its DAGs before deciding any."""

        queued_rows: dict[str, dict[int, datetime]]  # dag_id -> dataset_id -> created_at
        stored_as_read: dict[tuple[int, str], Any]  # (dataset_id, dag_id) -> created_at as stored
        dataset_ids_of: dict[str, set[int]]  # scheduled on, or named by a queue row
        dataset_uris: dict[int, str]
        newest_consumed: dict[str, dict[int, datetime]]  # by the DAG's latest run, per dataset
        latest_runs: dict[str, tuple[Any, ...]]  # latest dataset-triggered run's date, its interval end, any run's date
        database_now: datetime

    def _dags_with_unqueued_dataset_events(
        self, dataset_triggered_dag_info: dict[str, tuple[datetime, datetime]], session: Session
    ) -> list[DagModel]:
        """The sweep, once per ``requeue_interval_seconds``: the DAGs it adds (BUG_REPORT, "A stalled producer")."""
        manager = self._dataset_manager()
        interval = manager._dataset_race_fix_setting("requeue_interval_seconds")
        swept_at = self.__dict__.get("_dataset_race_fix_swept_at")
        if swept_at is not None and time.monotonic() - swept_at < interval:
            return []
        self.__dict__["_dataset_race_fix_swept_at"] = time.monotonic()
        now = manager._database_now(session)
        oldest_new = self._dags_with_new_unqueued_events(dataset_triggered_dag_info, now, session)
        if not oldest_new:
            return []
        runnable = self._runnable_dataset_dags(oldest_new, session)
        for dag_model in runnable:
            dataset_triggered_dag_info[dag_model.dag_id] = (oldest_new[dag_model.dag_id],) * 2
        if runnable:
            self.log.info(
                "%d dataset-scheduled DAG(s) have dataset events that no queue row brings in; deciding their runs: %s",
                len(runnable),
                [dm.dag_id for dm in runnable],
            )
        return runnable

    def _dags_with_new_unqueued_events(
        self, dataset_triggered_dag_info: dict[str, tuple[datetime, datetime]], now: datetime, session: Session
    ) -> dict[str, datetime]:
        """
        ``{dag_id: oldest such stamp}`` of the DAGs not in ``dataset_triggered_dag_info`` that the sweep brings in: the
        net's, and those whose newest event on a reference without a queue row is newer than their latest run (so no
        run consumed it; no run: than the reference) and than ``event_lookback_seconds`` (a DAG paused long ago waits).
        """
        from sqlalchemy import false, true

        manager = self._dataset_manager()
        ahead = manager._dataset_race_fix_setting("max_event_ahead_seconds")
        lookback = manager._dataset_race_fix_setting("event_lookback_seconds")
        reference = DagScheduleDatasetReference
        # ORDER BY .. LIMIT 1, not max(): for a correlated max() with a filter MySQL reads every event of the
        # dataset (run of the DAG); this stops at the first match walking the index backwards.
        newest = (
            select(DatasetEvent.timestamp)
            .where(
                DatasetEvent.dataset_id == reference.dataset_id,
                DatasetEvent.timestamp <= now + timedelta(seconds=ahead),
            )
            .order_by(DatasetEvent.timestamp.desc())
            .limit(1)
            .scalar_subquery()
        )
        latest_run = self._latest_dataset_run_date(reference.dag_id)
        queued = (
            select(DatasetDagRunQueue.dataset_id)
            .where(
                DatasetDagRunQueue.dataset_id == reference.dataset_id,
                DatasetDagRunQueue.target_dag_id == reference.dag_id,
            )
            .exists()
        )
        oldest_new: dict[str, datetime] = {  # the net's: DAGs with a late commit below their latest run
            dag_id: stamp
            for dag_id, stamp in self._dags_with_stranded_dataset_events(now, session).items()
            if dag_id not in dataset_triggered_dag_info
        }
        for dag_id, newest_event in session.execute(
            select(reference.dag_id, newest)
            .join(DagModel, DagModel.dag_id == reference.dag_id)
            .where(
                DagModel.is_paused == false(),
                DagModel.is_active == true(),
                ~queued,
                newest > func.coalesce(latest_run, reference.created_at),
                newest > now - timedelta(seconds=lookback),
            )
        ):
            if dag_id not in dataset_triggered_dag_info:
                oldest_new[dag_id] = min(oldest_new.get(dag_id, newest_event), newest_event)
        return oldest_new

    def _runnable_dataset_dags(
        self, oldest_new: dict[str, datetime], session: Session, *, lock_rows: bool = True
    ) -> list[DagModel]:
        """
        Of the DAGs of ``oldest_new``, at most ``max_dagruns_to_create_per_loop``, oldest event first, selected as
        ``DagModel.dags_needing_dagruns`` does, rows locked ``SKIP LOCKED`` (``lock_rows`` False: explain's, no lock).
        """
        from sqlalchemy import false, true

        limit = DagModel.NUM_DAGS_PER_DAGRUN_QUERY
        candidates = sorted(oldest_new, key=lambda dag_id: (oldest_new[dag_id], dag_id))[: 2 * limit]
        active_runs = dict(
            session.execute(
                select(DagRun.dag_id, func.count())
                .where(DagRun.dag_id.in_(candidates), DagRun.state.in_((DagRunState.QUEUED, DagRunState.RUNNING)))
                .group_by(DagRun.dag_id)
            ).all()
        )
        runnable_dags = select(DagModel).where(
            DagModel.dag_id.in_(candidates),
            DagModel.is_paused == false(),
            DagModel.is_active == true(),
            DagModel.has_import_errors == false(),
        )
        if lock_rows:
            runnable_dags = with_row_locks(runnable_dags, of=DagModel, session=session, skip_locked=True)
        dag_models = session.scalars(runnable_dags).all()
        return sorted(
            (dm for dm in dag_models if active_runs.get(dm.dag_id, 0) < dm.max_active_runs),
            key=lambda dm: (oldest_new[dm.dag_id], dm.dag_id),
        )[:limit]

    def _dags_with_stranded_dataset_events(self, now: datetime, session: Session) -> dict[str, datetime]:
        """
        The net under the floor (BUG_REPORT, "The net"): ``{dag_id: oldest such stamp}`` of the DAGs with an event
        below their latest run that no run of theirs consumed, kept until the DAG is decided. Each reference is read
        through once per ``full_read_interval_seconds`` in slices, each sweep its share of a round; a restart, which
        loses where the reads have got to, only starts them again.
        """
        from math import ceil

        slice_size = 1000  # events per statement: a few milliseconds of index probes
        budget_seconds = 0.005  # a sweep reads on while one more slice keeps it within (a fraction of a loop)

        net = self.__dict__.setdefault("_dataset_race_fix_net", {})
        for part in ("found", "cursor", "read_through_at", "slices"):
            net.setdefault(part, {})
        only = net.get("only")  # explain: these DAGs' references read through at once, no round
        manager = self._dataset_manager()
        interval = manager._dataset_race_fix_setting("full_read_interval_seconds")
        lookback = timedelta(seconds=manager._dataset_race_fix_setting("event_lookback_seconds"))
        started = time.monotonic()
        elapsed = started - net["ran_at"] if net.get("ran_at") is not None else 0.0
        net["ran_at"] = started

        references = self._net_references(only, session)
        read_through_at: dict[tuple[str, int], float] = net["read_through_at"]
        cursor: dict[tuple[str, int], tuple[datetime, int]] = net["cursor"]  # a read under way: from, slices so far
        slices_of: dict[tuple[str, int], int] = net["slices"]  # what a reference's last read took
        for forgotten in (read_through_at.keys() | cursor.keys() | slices_of.keys()) - references.keys():
            read_through_at.pop(forgotten, None), cursor.pop(forgotten, None), slices_of.pop(forgotten, None)
        due = sorted(
            (key for key in references if started - read_through_at.get(key, float("-inf")) >= interval),
            key=lambda key: (key not in cursor, read_through_at.get(key, float("-inf")), key),
        )
        # Slices this sweep reads at least: its share of the last round's (a reference not read yet: one slice).
        round_slices = sum(slices_of.get(key, 1) for key in references)
        share = float("inf") if not interval or only is not None else max(1, ceil(round_slices * elapsed / interval))
        slice_of_reference = self._stranded_events_slice(slice_size)

        found: dict[str, datetime] = net["found"]
        slices, slice_seconds = 0, 0.0  # slices read by this sweep; what the last one took
        for dag_id, dataset_id in due:
            key, latest = (dag_id, dataset_id), references[(dag_id, dataset_id)]
            while slices < share or time.monotonic() - started + slice_seconds < budget_seconds:
                start, read = cursor.get(key) or (min(latest, now) - lookback, 0)
                slice_started = time.monotonic()
                count, newest, stranded = session.execute(
                    slice_of_reference, {"dataset_id": dataset_id, "start": start, "end": latest, "dag_id": dag_id}
                ).one()
                slices, slice_seconds = slices + 1, time.monotonic() - slice_started
                if stranded is not None:
                    found[dag_id] = min(found.get(dag_id, stranded), stranded)
                if count < slice_size or newest is None:
                    cursor.pop(key, None)
                    read_through_at[key], slices_of[key] = time.monotonic(), read + 1
                    break
                # More: from this slice's newest stamp again, for its ties (one microsecond on if all share it).
                cursor[key] = (newest if newest > start else newest + timedelta(microseconds=1), read + 1)
            else:
                break  # this sweep's share and budget are spent
        return dict(found)

    @classmethod
    def _net_references(cls, only: set[str] | None, session: Session) -> dict[tuple[str, int], datetime]:
        """``{(dag_id, dataset_id): latest run}``: the references the net reads (active, unpaused DAGs with a dataset-triggered run; ``only`` these DAGs)."""
        from sqlalchemy import false, true

        latest_run = cls._latest_dataset_run_date(DagScheduleDatasetReference.dag_id)
        return {
            (dag_id, dataset_id): latest
            for dag_id, dataset_id, latest in session.execute(
                select(DagScheduleDatasetReference.dag_id, DagScheduleDatasetReference.dataset_id, latest_run)
                .join(DagModel, DagModel.dag_id == DagScheduleDatasetReference.dag_id)
                .where(DagModel.is_paused == false(), DagModel.is_active == true(), latest_run.is_not(None))
                .where(DagScheduleDatasetReference.dag_id.in_(only) if only is not None else true())
            )
        }

    @staticmethod
    def _latest_dataset_run_date(dag_id: Any) -> Any:
        """
        The date of the latest dataset-triggered run of the DAG ``dag_id`` (a correlated column), a scalar subquery:
        its newest run's if that one is dataset-triggered, else searched for (COALESCE evaluates the second only
        then). ORDER BY .. LIMIT 1, not max(): for a correlated max() with a filter MySQL reads every run. The newest
        run has no filter to misjudge: filtered on run_type, statistics taken before a bulk load chose a bitmap scan
        of all the DAG's runs and a sort (issue 30).
        """
        from sqlalchemy import case

        newest_if_dataset_triggered = (
            select(case((DagRun.run_type == DagRunType.DATASET_TRIGGERED, DagRun.execution_date)))
            .where(DagRun.dag_id == dag_id)
            .order_by(DagRun.execution_date.desc())
            .limit(1)
            .scalar_subquery()
        )
        searched = (
            select(DagRun.execution_date)
            .where(DagRun.dag_id == dag_id, DagRun.run_type == DagRunType.DATASET_TRIGGERED)
            .order_by(DagRun.execution_date.desc())
            .limit(1)
            .scalar_subquery()
        )
        return func.coalesce(newest_if_dataset_triggered, searched)

    @staticmethod
    def _stranded_events_slice(slice_size: int) -> Any:
        """
        One slice of one reference (``dataset_id``, stamps ``start`` to ``end``, ``dag_id``): how many
        events it read, the newest stamp among them, and the oldest that no run of the DAG consumed.
        """
        from sqlalchemy import bindparam, case

        from airflow.models.dataset import association_table

        event = select(DatasetEvent.id, DatasetEvent.timestamp).where(
            DatasetEvent.dataset_id == bindparam("dataset_id"),
            DatasetEvent.timestamp >= bindparam("start"),
            DatasetEvent.timestamp <= bindparam("end"),
        )
        piece = event.order_by(DatasetEvent.timestamp).limit(slice_size).subquery()
        # Each link's run by primary key, a scalar subquery: no plan can start from the DAG's runs per event.
        run_of_link = select(DagRun.dag_id).where(DagRun.id == association_table.c.dag_run_id).scalar_subquery()
        consumed = (
            select(association_table.c.event_id)
            .where(association_table.c.event_id == piece.c.id, run_of_link == bindparam("dag_id"))
            .exists()
        )
        unconsumed = func.min(case((~consumed, piece.c.timestamp)))
        return select(func.count(), func.max(piece.c.timestamp), unconsumed).select_from(piece)

    def _decide_dataset_triggered_runs(
        self,
        dag_models: Collection[DagModel],
        dataset_triggered_dag_info: dict[str, tuple[datetime, datetime]],
        session: Session,
    ) -> tuple[list[dict[str, Any]], list[tuple[int, str, Any]]]:
        """
        The runs this loop creates for these DAGs, and the queue rows it then deletes (as read); writes nothing, so
        that ``explain`` runs this very code. One decision per DAG, in dag_id order: ``dag_id``, ``dag``, ``events``,
        ``deferred``, ``late``, ``queued``, ``floors``, ``full_read``, ``run`` (None: it waits) and ``skipped`` (why).
        """
        manager = self._dataset_manager()
        state = self._read_dataset_decision_state(sorted(dm.dag_id for dm in dag_models), session)
        lookback = timedelta(seconds=manager._dataset_race_fix_setting("event_lookback_seconds"))
        commit_latency = timedelta(seconds=manager._dataset_race_fix_setting("commit_latency_seconds"))
        # DAGs the net found a late commit for: their next decision reads the whole window.
        net_found: dict[str, datetime] = self.__dict__.get("_dataset_race_fix_net", {}).get("found", {})
        # Nothing dated further ahead of the database's clock (a stock producer's host clock) dates a run.
        horizon = state.database_now + timedelta(seconds=manager._dataset_race_fix_setting("max_event_ahead_seconds"))
        consumed_rows: list[tuple[int, str, Any]] = []  # deleted at the end, as read
        decisions: list[dict[str, Any]] = []
        for dag_model in sorted(dag_models, key=lambda dm: dm.dag_id):
            decision: dict[str, Any] = {"dag_id": dag_model.dag_id, "run": None, "skipped": None}
            decisions.append(decision)
            dag = self.dagbag.get_dag(dag_model.dag_id, session=session)
            if not dag:
                self.log.error("DAG '%s' not found in serialized_dag table", dag_model.dag_id)
                decision["skipped"] = "not found in the serialized_dag table"
                continue
            if not isinstance(dag.timetable, DatasetTriggeredTimetable):
                self.log.error(
                    "DAG '%s' was dataset-scheduled, but didn't have a DatasetTriggeredTimetable!",
                    dag_model.dag_id,
                )
                decision["skipped"] = "not dataset-scheduled (no DatasetTriggeredTimetable)"
                continue
            queued = state.queued_rows.get(dag.dag_id, {})
            latest_run_date, latest_interval_end, latest_any_run_date = state.latest_runs.get(dag.dag_id, (None,) * 3)
            dataset_ids = sorted(state.dataset_ids_of[dag.dag_id])
            found_late = latest_run_date is not None and net_found.pop(dag.dag_id, None) is not None
            floors = self._dataset_floors(
                dataset_ids, latest_run_date, state.database_now, queued,
                state.newest_consumed.get(dag.dag_id, {}), found_late, horizon, lookback, commit_latency,
                self._checked_dataset_floors(dag.dag_id, dataset_ids, state.database_now, latest_run_date),
            )
            dataset_events = self._select_dataset_events(dag.dag_id, dataset_ids, floors, session)
            self._remember_dataset_reads(dag.dag_id, floors, dataset_events, state, commit_latency)
            choice = self._choose_dataset_run(
                dataset_events,
                horizon, latest_run_date, dataset_triggered_dag_info[dag.dag_id][1],
                queued, state.dataset_uris, lambda statuses: dag.timetable.dataset_condition.evaluate(statuses),
            )
            decision.update(
                dag=dag, events=choice.events, deferred=choice.deferred, queued=queued, floors=floors.floors,
                full_read=floors.full_read, late=choice.late,
            )
            if choice.old_serialization:  # as in DagModel.dags_needing_dagruns
                self.log.warning("dag '%s' has old serialization; skipping DAG run creation.", dag.dag_id)
                decision["skipped"] = "serialized before Airflow 2.9"
                continue
            consumed_rows += [(ds_id, dag.dag_id, state.stored_as_read[(ds_id, dag.dag_id)]) for ds_id in choice.rows_done]
            if choice.execution_date is not None:
                from dataclasses import replace

                events = self._events_for_timetable(dag.timetable, choice.events, session)
                decision["run"] = self._dataset_triggered_run(
                    dag, replace(choice, events=events), latest_interval_end, latest_any_run_date, session
                )
        return decisions, consumed_rows

    def _dataset_statement(self, key: tuple[Any, ...], build: Callable[[], Any]) -> Any:
        """The statement kept under ``key``, built by ``build()`` once a process (BUG_REPORT section 7: loop cost)."""
        statements: dict[tuple[Any, ...], Any] = self.__dict__.setdefault("_dataset_race_fix_statements", {})
        if key not in statements:
            statements[key] = build()
        return statements[key]

    def _read_dataset_decision_state(self, dag_ids: list[str], session: Session) -> _DatasetDecisionState:
        """The state the decisions of ``dag_ids`` start from, read without locks, two statements per 500 DAGs."""
        from sqlalchemy import Text, bindparam, cast

        dialect = session.bind.dialect.name
        clock = self._dataset_manager()._database_clock(dialect)
        as_stored = cast(DatasetDagRunQueue.created_at, Text) if dialect == "sqlite" else DatasetDagRunQueue.created_at
        queue_rows_of_dags = self._dataset_statement(
            ("queue rows", dialect),
            lambda: select(
                DatasetDagRunQueue.dataset_id,
                DatasetDagRunQueue.target_dag_id,
                DatasetDagRunQueue.created_at,
                as_stored.label("stored"),
            ).where(DatasetDagRunQueue.target_dag_id.in_(bindparam("dag_ids", expanding=True))),
        )
        runs_and_datasets_of_dags = self._dataset_statement(
            ("runs and datasets", dialect, clock), lambda: self._runs_and_datasets_statement(dialect, clock)
        )
        queued_rows: dict[str, dict[int, datetime]] = defaultdict(dict)
        stored_as_read: dict[tuple[int, str], Any] = {}
        database_now: datetime | None = None
        dataset_ids_of: dict[str, set[int]] = defaultdict(set)
        dataset_uris: dict[int, str] = {}
        newest_consumed: dict[str, dict[int, datetime]] = defaultdict(dict)
        latest_runs: dict[str, tuple[Any, ...]] = {}  # run date, interval end, any run's date
        for start in range(0, len(dag_ids), 500):
            chunk = dag_ids[start : start + 500]
            for dataset_id, target_dag_id, created_at, stored in session.execute(queue_rows_of_dags, {"dag_ids": chunk}):
                queued_rows[target_dag_id][dataset_id] = created_at
                stored_as_read[(dataset_id, target_dag_id)] = stored
            for dag_id, *dates, now, dataset_id, uri, newest in session.execute(
                runs_and_datasets_of_dags, {"dag_ids": chunk}
            ):
                latest_runs[dag_id] = tuple(dates)
                database_now = database_now or now
                if dataset_id is not None:
                    dataset_ids_of[dag_id].add(dataset_id)
                    dataset_uris[dataset_id] = uri
                if newest is not None:
                    newest_consumed[dag_id][dataset_id] = newest
        for dag_id, queued in queued_rows.items():  # an alias resolved before its DAG was parsed again
            dataset_ids_of[dag_id].update(queued)
        unknown = sorted(set().union(*queued_rows.values()) - dataset_uris.keys())
        for start in range(0, len(unknown), 500):
            dataset_uris.update(
                session.execute(
                    select(DatasetModel.id, DatasetModel.uri).where(DatasetModel.id.in_(unknown[start : start + 500]))
                )
            )
        database_now = database_now or self._dataset_manager()._database_now(session)
        return self._DatasetDecisionState(
            queued_rows, stored_as_read, dataset_ids_of, dataset_uris, newest_consumed, latest_runs, database_now
        )

    @classmethod
    def _runs_and_datasets_statement(cls, dialect: str, clock: str | None) -> Any:
        """
        Per DAG of ``dag_ids``, a row per dataset it is scheduled on (or one without): its latest runs, the database's
        clock, and the dataset's id, URI and newest event the latest run consumed (BUG_REPORT, "The floor").
        """
        from sqlalchemy import bindparam, literal_column, null

        from airflow.models.dataset import association_table
        from airflow.utils.sqlalchemy import UtcDateTime

        def latest_run_of(column: Any) -> Any:
            return (
                select(column)
                .where(DagRun.dag_id == DagModel.dag_id, DagRun.run_type == DagRunType.DATASET_TRIGGERED)
                .order_by(DagRun.execution_date.desc())
                .limit(1)
                .correlate(DagModel)  # explicit: from two levels down it would not be
                .scalar_subquery()
            )

        reference = DagScheduleDatasetReference
        clock_column = literal_column(clock, UtcDateTime) if clock else null()  # SQLite: this host's clock
        if dialect == "postgresql":
            return cls._postgres_runs_and_datasets_statement(reference, clock_column)
        latest_of_any_type = select(func.max(DagRun.execution_date)).where(DagRun.dag_id == DagModel.dag_id)
        # As on PostgreSQL, the run's links first (STRAIGHT_JOIN), newest first: a max() let MariaDB
        # start from the dataset's history (40 000 rows read for 20 000 events; issue 30).
        newest_consumed_by_latest_run = (
            select(DatasetEvent.timestamp)
            .select_from(association_table.join(DatasetEvent, DatasetEvent.id == association_table.c.event_id))
            .where(
                association_table.c.dag_run_id == latest_run_of(DagRun.id),
                DatasetEvent.dataset_id == reference.dataset_id,
            )
            .order_by(association_table.c.event_id.desc())
            .limit(1)
            .prefix_with("STRAIGHT_JOIN", dialect="mysql")
            .scalar_subquery()
        )
        return (
            select(
                DagModel.dag_id,
                latest_run_of(DagRun.execution_date),
                latest_run_of(DagRun.data_interval_end),
                latest_of_any_type.scalar_subquery(),
                clock_column,
                DatasetModel.id,
                DatasetModel.uri,
                newest_consumed_by_latest_run,
            )
            .outerjoin(reference, reference.dag_id == DagModel.dag_id)
            .outerjoin(DatasetModel, DatasetModel.id == reference.dataset_id)
            .where(DagModel.dag_id.in_(bindparam("dag_ids", expanding=True)))
        )

    @staticmethod
    def _postgres_runs_and_datasets_statement(reference: Any, clock_column: Any) -> Any:
        """``_runs_and_datasets_statement`` on PostgreSQL, planned by the rows it needs whatever the statistics."""
        from sqlalchemy import bindparam, case, true

        from airflow.models.dataset import association_table

        # The DAG's newest run of any type, then, only if that one is not dataset-triggered, the newest that is (a
        # one-time filter skips that scan otherwise). Filtered on run_type, the one scan let statistics taken before a
        # bulk load choose a bitmap scan of all the DAG's runs and a sort (1.2 ms at 5 000 runs, 10 us unfiltered).
        newest = (
            select(DagRun.id, DagRun.execution_date, DagRun.data_interval_end, DagRun.run_type)
            .where(DagRun.dag_id == DagModel.dag_id)
            .order_by(DagRun.execution_date.desc())
            .limit(1)
            .correlate(DagModel)
            .lateral()
        )
        searched = (
            select(DagRun.id, DagRun.execution_date, DagRun.data_interval_end)
            .where(
                newest.c.run_type != DagRunType.DATASET_TRIGGERED,
                DagRun.dag_id == DagModel.dag_id,
                DagRun.run_type == DagRunType.DATASET_TRIGGERED,
            )
            .order_by(DagRun.execution_date.desc())
            .limit(1)
            .correlate(DagModel, newest)
            .lateral()
        )
        newest_is_it = newest.c.run_type == DagRunType.DATASET_TRIGGERED
        latest_id, latest_date, latest_interval_end = (
            case((newest_is_it, mine), else_=other)
            for mine, other in (
                (newest.c.id, searched.c.id),
                (newest.c.execution_date, searched.c.execution_date),
                (newest.c.data_interval_end, searched.c.data_interval_end),
            )
        )
        event_of_link = (
            select(DatasetEvent.timestamp)
            .where(DatasetEvent.id == association_table.c.event_id, DatasetEvent.dataset_id == reference.dataset_id)
            .offset(0)  # LATERAL, not pulled up into a plain join
            .correlate(association_table, reference)  # the link beside it, the reference two levels up
            .lateral()
        )
        # The run's links newest first, to the first of this dataset: stamped at most the newest (a lower floor, never
        # higher), found at once, where a max() read all of a first run's 50 000 links.
        newest_consumed_by_latest_run = (
            select(event_of_link.c.timestamp)
            .select_from(association_table.join(event_of_link, true()))
            .where(association_table.c.dag_run_id == latest_id)
            .order_by(association_table.c.event_id.desc())
            .limit(1)
            .correlate(reference, newest, searched)
            .scalar_subquery()
        )
        return (
            select(
                DagModel.dag_id,
                latest_date,
                latest_interval_end,
                newest.c.execution_date,  # any run's latest (execution_date is never NULL)
                clock_column,
                DatasetModel.id,
                DatasetModel.uri,
                newest_consumed_by_latest_run,
            )
            .select_from(DagModel)
            .outerjoin(newest, true())
            .outerjoin(searched, true())
            .outerjoin(reference, reference.dag_id == DagModel.dag_id)
            .outerjoin(DatasetModel, DatasetModel.id == reference.dataset_id)
            .where(DagModel.dag_id.in_(bindparam("dag_ids", expanding=True)))
        )

    @staticmethod
    def _events_not_consumed_statement(dialect: str, groups: int) -> Any:
        """
        Events of datasets ``ids_<i>`` from ``floor_<i>`` on (``i < groups``) that no run of ``dag_id`` from
        ``runs_floor`` on consumed. ``groups`` 0: every event of ``ids_0`` (a DAG's first run).
        """
        from sqlalchemy import bindparam, true

        from airflow.models.dataset import association_table

        # What the decision counts and dates by, and the key to the producer's run (the timetable's): no ORM.
        names = ("id", "dataset_id", "timestamp", "source_dag_id", "source_run_id")  # _DatasetEventRead's
        columns = [getattr(DatasetEvent, name) for name in names]
        if not groups:
            return select(*columns).where(DatasetEvent.dataset_id.in_(bindparam("ids_0", expanding=True)))
        # What this DAG consumed: a run is never dated before its events, so only its runs from the lowest floor on
        # matter, a small set the databases hash once instead of probing per event.
        runs_from_floor = (DagRun.dag_id == bindparam("dag_id"), DagRun.execution_date >= bindparam("runs_floor"))
        if dialect != "postgresql":
            consumed = (
                select(association_table.c.event_id)
                .join(DagRun, DagRun.id == association_table.c.dag_run_id)
                .where(*runs_from_floor)
            )
        else:
            # One index probe per run: LATERAL keeps PostgreSQL from hashing the whole association table.
            runs = select(DagRun.id).where(*runs_from_floor).subquery()
            links = (
                select(association_table.c.event_id)
                .where(association_table.c.dag_run_id == runs.c.id)
                .offset(0)  # not pulled up into a plain join, which it would hash
                .lateral()
            )
            consumed = select(links.c.event_id).select_from(runs.join(links, true()))
        chosen = select(*columns).where(
            or_(
                *(
                    and_(
                        DatasetEvent.dataset_id.in_(bindparam(f"ids_{i}", expanding=True)),
                        DatasetEvent.timestamp >= bindparam(f"floor_{i}"),
                    )
                    for i in range(groups)
                )
            ),
            DatasetEvent.id.not_in(consumed),
        )
        if dialect == "mysql":
            # InnoDB's secondary indexes carry the primary key: the check runs on the index, and reads only kept rows.
            chosen = select(*columns).where(DatasetEvent.id.in_(chosen.with_only_columns(DatasetEvent.id)))
        return chosen

    @classmethod
    def _dataset_floors(
        cls,
        dataset_ids: list[int],
        latest_run_date: datetime | None,
        database_now: datetime,
        queued: dict[int, datetime],
        newest_consumed: dict[int, datetime],
        found_late: bool,
        horizon: datetime,
        lookback: timedelta,
        commit_latency: timedelta,
        checked: dict[int, datetime] | None = None,
    ) -> _DatasetFloors:
        """
        Where a DAG reads each dataset's events from (BUG_REPORT, "The floor"); pure. ``checked``: per dataset, where
        this process's last read of it left nothing unconsumed to find (``_remember_dataset_reads``); it raises the
        newest consumed event's floor, never a queue row's.
        """
        if latest_run_date is None:  # no run of this DAG has consumed anything yet
            return cls._DatasetFloors({}, None, True)
        full_floor = min([latest_run_date, database_now, *queued.values()]) - lookback
        full_read = found_late or latest_run_date > horizon  # the net found one; a clock stepped back
        checked = checked or {}
        floors: dict[int, datetime] = {}
        for dataset_id in dataset_ids:
            newest = newest_consumed.get(dataset_id)
            if full_read or newest is None:
                floors[dataset_id] = full_floor
            else:
                floor = max(newest - commit_latency, checked.get(dataset_id, full_floor))
                if dataset_id in queued:
                    floor = min(floor, queued[dataset_id] - commit_latency)
                floors[dataset_id] = max(floor, full_floor)
        return cls._DatasetFloors(floors, min(floors.values(), default=full_floor), full_read)

    def _remember_dataset_reads(
        self,
        dag_id: str,
        floors: _DatasetFloors,
        events: list[Any],
        state: _DatasetDecisionState,
        commit_latency: timedelta,
    ) -> None:
        """
        After a read of ``dag_id``'s events from ``floors``, which followed the clock's reading ``state.database_now``:
        per dataset, below what nothing it has not consumed can appear, so that this process's next read starts there
        (BUG_REPORT, "The floor", what a process remembers). An event committed before the read was read, or lay below
        a floor that was safe; one committed after it is stamped at most ``commit_latency`` before that reading.
        """
        if floors.runs_floor is None:  # a first run: every event was read, nothing is left behind it
            return
        checked: dict[tuple[str, int], tuple[datetime, datetime, datetime]] = self.__dict__.setdefault(
            "_dataset_race_fix_checked", {}
        )
        if len(checked) > 100_000:  # DAGs come and go: forgetting only makes a read start lower
            checked.clear()
        lowest_left: dict[int, datetime] = {}
        for event in events:  # deferred, late and waiting ones alike: still unconsumed
            lowest_left[event.dataset_id] = min(event.timestamp, lowest_left.get(event.dataset_id, event.timestamp))
        read_at, latest_run_date = state.database_now, state.latest_runs[dag_id][0]
        below = read_at - commit_latency
        for dataset_id in floors.floors:
            checked[(dag_id, dataset_id)] = (read_at, latest_run_date, min(lowest_left.get(dataset_id, below), below))

    def _checked_dataset_floors(
        self, dag_id: str, dataset_ids: list[int], database_now: datetime, latest_run_date: datetime | None
    ) -> dict[int, datetime]:
        """
        What ``_remember_dataset_reads`` kept for ``dag_id``, unless the clock has gone back since, or the DAG's latest
        run is older than it was then (deleted: its events are unconsumed again).
        """
        checked: dict[tuple[str, int], tuple[datetime, datetime, datetime]] = self.__dict__.get(
            "_dataset_race_fix_checked", {}
        )
        floors = {}
        for dataset_id in dataset_ids:
            read_at, run_date, floor = checked.get((dag_id, dataset_id), (None, None, None))
            if read_at is not None and read_at <= database_now and latest_run_date and run_date <= latest_run_date:
                floors[dataset_id] = floor
        return floors

    def _select_dataset_events(
        self, dag_id: str, dataset_ids: list[int], floors: _DatasetFloors, session: Session
    ) -> list[Any]:
        """The events of ``dataset_ids`` from their floors on that no run of ``dag_id`` consumed (per 500 datasets)."""
        dialect = session.bind.dialect.name
        dataset_events = []
        for start in range(0, len(dataset_ids), 500):
            chunk = dataset_ids[start : start + 500]
            if floors.runs_floor is None:
                chosen = self._dataset_statement(
                    ("events", dialect, 0), lambda: self._events_not_consumed_statement(dialect, 0)
                )
                params = {"ids_0": chunk}
            else:
                by_floor: dict[datetime, list[int]] = defaultdict(list)
                for dataset_id in chunk:
                    by_floor[floors.floors[dataset_id]].append(dataset_id)
                groups = len(by_floor)
                chosen = self._dataset_statement(
                    ("events", dialect, groups), lambda: self._events_not_consumed_statement(dialect, groups)
                )
                params = {"dag_id": dag_id, "runs_floor": floors.runs_floor}
                for i, (floor, ids) in enumerate(sorted(by_floor.items())):
                    params.update({f"ids_{i}": ids, f"floor_{i}": floor})
            # On the connection: the ORM's result layer doubled the time of 200 000 rows (issue 49).
            dataset_events += [self._DatasetEventRead(*row) for row in session.connection().execute(chosen, params)]
        return dataset_events

    @classmethod
    def _choose_dataset_run(
        cls,
        dataset_events: list[Any],
        horizon: datetime,
        latest_run_date: datetime | None,
        loop_date: datetime,
        queued: dict[int, datetime],
        dataset_uris: dict[int, str],
        evaluate: Callable[[dict[str, bool]], bool],
    ) -> _DatasetRunChoice:
        """
        Whether a DAG's events make a run, and its logical date before the unique-date check; pure. Events beyond the
        horizon wait (a run is never dated before its events). No run: the queue rows of datasets with nothing to
        consume are deleted (as read), so the DAG takes no slot it cannot use (BUG_REPORT, "A stalled producer").
        """
        deferred = [event for event in dataset_events if event.timestamp > horizon]
        events = [event for event in dataset_events if event.timestamp <= horizon]
        late = [event for event in events if latest_run_date and event.timestamp <= latest_run_date]
        with_events = {event.dataset_id for event in events}
        statuses = {dataset_uris[dataset_id]: True for dataset_id in with_events if dataset_id in dataset_uris}
        try:
            ready = bool(events) and evaluate(statuses)
        except AttributeError:  # serialized before 2.9
            return cls._DatasetRunChoice(events, deferred, late, None, (), old_serialization=True)
        if not ready:
            return cls._DatasetRunChoice(events, deferred, late, None, tuple(d for d in queued if d not in with_events))
        queue_dates = (timezone.coerce_datetime(loop_date), *queued.values())
        execution_date = max(
            [*(created_at for created_at in queue_dates if created_at <= horizon), *(e.timestamp for e in events)]
        )
        if latest_run_date:
            execution_date = max(execution_date, latest_run_date + timedelta(microseconds=1))
        return cls._DatasetRunChoice(events, deferred, late, execution_date, tuple(queued))

    @classmethod
    def _events_for_timetable(cls, timetable: Any, events: list[Any], session: Session) -> list[Any]:
        """
        ``events`` as ``timetable`` reads them for a run's interval and run_id. Airflow's read each event's
        ``source_dag_run``, a lazy load each (most of 24 s for 50 000 events, issue 49): set here from a statement per
        500 producer runs, matched on dag_id and run_id as the relationship is. A timetable that overrides them (but
        DatasetOrTimeSchedule's run_id, which takes no event) gets Airflow's objects.
        """
        from airflow.timetables.datasets import DatasetOrTimeSchedule

        kind, own = type(timetable), DatasetTriggeredTimetable
        if kind.data_interval_for_events is not own.data_interval_for_events or kind.generate_run_id not in (
            own.generate_run_id, DatasetOrTimeSchedule.generate_run_id
        ):
            return cls._dataset_events_by_id([event.id for event in events], session)
        run_ids_of: dict[str, set[str]] = defaultdict(set)
        for event in events:
            if event.source_dag_id is not None and event.source_run_id is not None:
                run_ids_of[event.source_dag_id].add(event.source_run_id)
        runs: dict[tuple[str, str], Any] = {}
        columns = DagRun.run_id, DagRun.data_interval_start, DagRun.data_interval_end
        for dag_id, run_ids in run_ids_of.items():
            run_ids = sorted(run_ids)
            for start in range(0, len(run_ids), 500):  # SQLite before 3.32: 999 variables
                chunk = select(*columns).where(DagRun.dag_id == dag_id, DagRun.run_id.in_(run_ids[start : start + 500]))
                runs.update(((dag_id, run.run_id), run) for run in session.execute(chunk))
        for event in events:
            event.source_dag_run = runs.get((event.source_dag_id, event.source_run_id))
        return events

    @staticmethod
    def _dataset_events_by_id(event_ids: list[int], session: Session) -> list[DatasetEvent]:
        """Airflow's objects of the events ``event_ids``, in that order, but those deleted since (500 a statement)."""
        by_id: dict[int, DatasetEvent] = {}
        for start in range(0, len(event_ids), 500):
            chunk = select(DatasetEvent).where(DatasetEvent.id.in_(event_ids[start : start + 500]))
            by_id.update((event.id, event) for event in session.scalars(chunk))
        return [by_id[event_id] for event_id in event_ids if event_id in by_id]

    def _dataset_triggered_run(
        self,
        dag: Any,
        choice: _DatasetRunChoice,
        latest_interval_end: datetime | None,
        latest_any_run_date: datetime | None,
        session: Session,
    ) -> dict[str, Any]:
        """The run ``choice`` makes: ``execution_date`` (unique), ``data_interval`` and ``run_id``."""
        exec_date = choice.execution_date
        # Explicitly check if a DagRun already exists at this date (a manual run, say):
        # move past it rather than fail on the unique key or leave the queue rows behind.
        if latest_any_run_date and exec_date <= latest_any_run_date:
            while session.scalar(
                select(func.count(DagRun.id)).where(DagRun.dag_id == dag.dag_id, DagRun.execution_date == exec_date)
            ):
                exec_date += timedelta(microseconds=1)
        exec_date = timezone.coerce_datetime(exec_date)

        data_interval = dag.timetable.data_interval_for_events(exec_date, choice.events)
        if latest_interval_end and data_interval.start < latest_interval_end:
            from airflow.timetables.base import DataInterval

            # Never backwards, never overlapping the previous run's interval.
            start = timezone.coerce_datetime(latest_interval_end)
            data_interval = DataInterval(start, max(data_interval.end, start))
        run_id = dag.timetable.generate_run_id(
            run_type=DagRunType.DATASET_TRIGGERED,
            logical_date=exec_date,
            data_interval=data_interval,
            session=session,
            events=choice.events,
        )
        return {"execution_date": exec_date, "data_interval": data_interval, "run_id": run_id}

    def _create_dag_runs_dataset_triggered(
        self,
        dag_models: Collection[DagModel],
        dataset_triggered_dag_info: dict[str, tuple[datetime, datetime]],
        session: Session,
    ) -> None:
        """For DAGs that are triggered by datasets, create dag runs."""
        decisions, consumed_rows = self._decide_dataset_triggered_runs(
            dag_models, dataset_triggered_dag_info, session
        )
        for decision in decisions:
            if decision["skipped"]:
                continue
            dag = decision["dag"]
            if ahead := decision["deferred"]:
                Stats.incr("dataset_race_fix.future_events_deferred", len(ahead))
                warned = self.__dict__.setdefault("_dataset_race_fix_warned_ahead", set())
                if dag.dag_id not in warned:
                    warned.add(dag.dag_id)
                    self.log.warning(
                        "DAG '%s': %d dataset event(s) dated up to %s, ahead of the scheduler's clock by more "
                        "than [dataset_race_fix] max_event_ahead_seconds; they wait until the clock gets there "
                        "(a producer host's clock runs ahead)",
                        dag.dag_id,
                        len(ahead),
                        max(event.timestamp for event in ahead),
                    )
            if decision["run"] is None:
                Stats.incr("dataset_race_fix.empty_runs_prevented")
                continue
            if late := len(decision["late"]):
                Stats.incr("dataset_race_fix.late_events_consumed", late)
                self.log.info(
                    "DAG '%s': the new run consumes %d event(s) dated before its latest run: late "
                    "commits, or events of a deleted run (deleting a run gives its events back)",
                    dag.dag_id,
                    late,
                )
            dag_hash = self.dagbag.dags_hash.get(dag.dag_id)
            dag_run = dag.create_dagrun(
                run_id=decision["run"]["run_id"],
                run_type=DagRunType.DATASET_TRIGGERED,
                execution_date=decision["run"]["execution_date"],
                data_interval=decision["run"]["data_interval"],
                state=DagRunState.QUEUED,
                external_trigger=False,
                session=session,
                dag_hash=dag_hash,
                creating_job_id=self.job.id,
            )
            Stats.incr("dataset.triggered_dagruns")
            self._link_consumed_events(dag_run.id, [event.id for event in decision["events"]], session)
        if consumed_rows:
            self._delete_dataset_queue_rows_as_read(consumed_rows, session)

    @staticmethod
    def _link_consumed_events(dag_run_id: int, event_ids: list[int], session: Session) -> None:
        """
        Link a new run to its events in their order, 10 000 a statement, not as ORM objects (issue 49). The ids are
        integers written into it, no bound variables (SQLite before 3.32 takes 999): 44 bytes a row at most (two
        20-digit ids), 440 000 a statement, under SQLite's SQL length limit (1 000 000 by default) and MySQL's
        max_allowed_packet (16 MiB by default on MariaDB, 64 MiB on MySQL 8); PostgreSQL's is 1 GiB.
        """
        insert = "INSERT INTO dagrun_dataset_event (dag_run_id, event_id) VALUES "
        for start in range(0, len(event_ids), 10_000):
            rows = ",".join(f"({int(dag_run_id)},{int(event_id)})" for event_id in event_ids[start : start + 10_000])
            session.connection().exec_driver_sql(insert + rows)

    @staticmethod
    def _delete_dataset_queue_rows_as_read(rows: list[tuple[int, str, Any]], session: Session) -> None:
        """
        Delete queue rows ``(dataset_id, target_dag_id, created_at as read)`` that still hold that value, 500 a
        statement, locking no other row and skipping a producer's where it can (BUG_REPORT, "Lock discipline").
        """
        from sqlalchemy import Text, any_, bindparam, cast, literal_column, tuple_

        rows = sorted(rows)
        dialect = session.bind.dialect
        if dialect.name == "sqlite":  # one writer at a time, no row locks; executemany, no statement limit
            session.execute(
                delete(DatasetDagRunQueue)
                .where(
                    DatasetDagRunQueue.dataset_id == bindparam("b_dataset_id"),
                    DatasetDagRunQueue.target_dag_id == bindparam("b_target_dag_id"),
                    cast(DatasetDagRunQueue.created_at, Text) == bindparam("b_stored", type_=Text),
                )
                .execution_options(synchronize_session=False),
                [{"b_dataset_id": d, "b_target_dag_id": t, "b_stored": s} for d, t, s in rows],
            )
            return
        key_columns = (DatasetDagRunQueue.dataset_id, DatasetDagRunQueue.target_dag_id)
        as_read = tuple_(*key_columns, DatasetDagRunQueue.created_at)
        for start in range(0, len(rows), 500):
            chunk = rows[start : start + 500]
            if dialect.name == "postgresql":
                # Take the rows still as read, skipping those a producer holds, and delete them by address. ARRAY(..)
                # runs the locking select once (an InitPlan); an IN subquery can be rescanned per queue row.
                ctid = literal_column("ctid")
                taken = select(ctid).select_from(DatasetDagRunQueue.__table__).where(as_read.in_(chunk))
                session.execute(
                    delete(DatasetDagRunQueue)
                    .where(ctid == any_(func.array(taken.with_for_update(skip_locked=True).scalar_subquery())))
                    .execution_options(synchronize_session=False)
                )
                continue
            # MySQL/MariaDB: lock by primary key, skipping what producers hold where the server can (else waiting
            # in key order, as producers do: no cycle), then delete exactly those keys by primary key.
            version = dialect.server_version_info or ()
            taken = session.execute(
                select(*key_columns)
                .with_hint(DatasetDagRunQueue.__table__, "FORCE INDEX (PRIMARY)")
                .where(as_read.in_(chunk))
                .with_for_update(skip_locked=version >= ((10, 6) if dialect.is_mariadb else (8, 0, 1)))
            ).all()
            if taken:
                # One primary-key lookup per key taken: a scan would wait on rows it does not name.
                from airflow.datasets.manager import DatasetManager

                keys_first, params = DatasetManager._queue_keys_joined_first([tuple(row) for row in taken])
                DatasetManager._send(session, f"DELETE q FROM {keys_first}", params)
