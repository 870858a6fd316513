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
        # latest dataset-triggered run's date, its interval end, any run's date, oldest dataset-triggered run's date
        latest_runs: dict[str, tuple[Any, ...]]
        database_now: datetime

    def _dags_with_unqueued_dataset_events(
        self, dataset_triggered_dag_info: dict[str, tuple[datetime, datetime]], session: Session
    ) -> list[DagModel]:
        """The sweep, once per ``requeue_interval_seconds``: the DAGs it adds (BUG_REPORT, "A stalled producer")."""
        manager = self._dataset_manager()
        interval = manager._dataset_race_fix_setting("requeue_interval_seconds")
        # the net, every loop (bounded): DAGs with a late commit below where their next read starts
        oldest_new = {
            dag_id: stamp
            for dag_id, stamp in self._dags_with_stranded_dataset_events(session).items()
            if dag_id not in dataset_triggered_dag_info
        }
        swept_at = self.__dict__.get("_dataset_race_fix_swept_at")
        if swept_at is None or time.monotonic() - swept_at >= interval:
            self.__dict__["_dataset_race_fix_swept_at"] = time.monotonic()
            now = manager._database_now(session)
            for dag_id, stamp in self._dags_with_new_unqueued_events(dataset_triggered_dag_info, now, session).items():
                oldest_new[dag_id] = min(oldest_new.get(dag_id, stamp), stamp)
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
        ``{dag_id: oldest such stamp}`` of the DAGs not in ``dataset_triggered_dag_info`` that the sweep brings in:
        those whose newest event on a reference without a queue row is newer than their latest run (so no run
        consumed it; no run: than the reference) and than ``event_lookback_seconds`` (a DAG paused long ago waits).
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
        oldest_new: dict[str, datetime] = {}
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
        Of the DAGs of ``oldest_new``, at most ``max_dagruns_to_create_per_loop`` that can run (active, unpaused, no
        import errors, below ``max_active_runs``: a DAG that cannot run takes no place from one that can), oldest
        event first, rows locked ``SKIP LOCKED`` as ``DagModel.dags_needing_dagruns`` does (``lock_rows`` False:
        explain's, no lock). The net forgets what it found for a DAG that is gone or inactive.
        """
        from sqlalchemy import false, true

        dag_ids, can_run, present = sorted(oldest_new), [], set()
        for start in range(0, len(dag_ids), 500):
            chunk = dag_ids[start : start + 500]
            active_runs = dict(
                session.execute(
                    select(DagRun.dag_id, func.count())
                    .where(DagRun.dag_id.in_(chunk), DagRun.state.in_((DagRunState.QUEUED, DagRunState.RUNNING)))
                    .group_by(DagRun.dag_id)
                ).all()
            )
            for dag_id, is_paused, has_import_errors, max_active_runs in session.execute(
                select(DagModel.dag_id, DagModel.is_paused, DagModel.has_import_errors, DagModel.max_active_runs)
                .where(DagModel.dag_id.in_(chunk), DagModel.is_active == true())
            ):
                present.add(dag_id)
                room = max_active_runs is None or active_runs.get(dag_id, 0) < max_active_runs
                if room and not is_paused and not has_import_errors:
                    can_run.append(dag_id)
        found = self.__dict__.get("_dataset_race_fix_net", {}).get("found", {})
        for gone in set(dag_ids) - present:
            found.pop(gone, None)
        picked = sorted(can_run, key=lambda dag_id: (oldest_new[dag_id], dag_id))[: DagModel.NUM_DAGS_PER_DAGRUN_QUERY]
        if not picked:
            return []
        runnable_dags = select(DagModel).where(DagModel.dag_id.in_(picked), DagModel.is_paused == false())
        if lock_rows:
            runnable_dags = with_row_locks(runnable_dags, of=DagModel, session=session, skip_locked=True)
        return sorted(session.scalars(runnable_dags).all(), key=lambda dm: (oldest_new[dm.dag_id], dm.dag_id))

    def _dags_with_stranded_dataset_events(self, session: Session) -> dict[str, datetime]:
        """
        The net under the floor (BUG_REPORT, "The net"): ``{dag_id: oldest such stamp}`` of the DAGs with an event
        below where their next read starts that no run of theirs consumed, kept until the DAG is decided. It follows
        the event ids (what became visible since its last look), in a loop at most every half second; after a start
        it also reads each reference's window once (what committed while no process looked), within 3 % of the time.
        ``net_look_interval_seconds`` 0 (tests, the explorer): a look every loop, and the windows read at once.
        """
        net = self.__dict__.setdefault("_dataset_race_fix_net", {})
        found: dict[str, dict[int, datetime]] = net.setdefault("found", {})
        only = net.get("only")  # explain: these DAGs' windows read through at once, nothing followed
        interval = self._dataset_manager()._dataset_race_fix_setting("net_look_interval_seconds")
        if only is None and time.monotonic() - net.get("looked_at", float("-inf")) >= interval:
            net["looked_at"] = time.monotonic()
            self._follow_dataset_event_ids(net, session)
        if only is not None or net.get("window_order", True):  # (the pass done: an empty order)
            self._read_dataset_windows_once(net, only, session, at_once=only is not None or not interval)
        return {dag_id: min(stamps.values()) for dag_id, stamps in found.items() if stamps}

    def _follow_dataset_event_ids(self, net: dict[str, Any], session: Session) -> None:
        """
        The events that became visible since this process last looked: ids above the highest seen, and ids below it
        that were missing then (a transaction in flight; a rollback's id never appears and is forgotten after
        ``event_lookback_seconds``). One stamped more than ``commit_latency_seconds`` before the clock read after the
        look committed slower than the floor allows for (BUG_REPORT, "The net"): its consumers that have not consumed
        it, and whose next read may start above it, are found. An id is allocated at INSERT, before the stamp, on
        every backend (PostgreSQL's sequence, InnoDB's counter; SQLite's one writer makes them visible in order).
        """
        manager = self._dataset_manager()
        forget_after = manager._dataset_race_fix_setting("event_lookback_seconds")
        latency = timedelta(seconds=manager._dataset_race_fix_setting("commit_latency_seconds"))
        columns = (DatasetEvent.id, DatasetEvent.dataset_id, DatasetEvent.timestamp)
        missing: dict[int, float] = net.setdefault("missing", {})  # id -> when it was first missed (monotonic)
        looked_at, high = time.monotonic(), net.get("high")
        if high is None:  # a new process: the last ids not there yet may still commit
            high = session.scalar(select(func.max(DatasetEvent.id))) or 0
            there = set(session.scalars(select(DatasetEvent.id).where(DatasetEvent.id > high - 10_000)))
            # (from the oldest there: ids below it were deleted, by db clean say, or belong to an old rollback)
            missing.update(dict.fromkeys(set(range(min(there, default=high), high)) - there, looked_at))
            net["high"] = high
            return
        # At most 5 000 new and 1 000 missing ids a loop: a backlog is read in the loops after.
        new_ids = select(*columns).where(DatasetEvent.id > high).order_by(DatasetEvent.id).limit(5000)
        appeared = session.execute(new_ids).all()
        if appeared:
            gaps = set(range(high + 1, appeared[-1].id)) - {row.id for row in appeared}
            missing.update(dict.fromkeys(gaps, looked_at))
            net["high"] = appeared[-1].id
        waiting = sorted(missing)
        probe_from = net.get("probe_from", 0) if net.get("probe_from", 0) < len(waiting) else 0
        probe = waiting[probe_from : probe_from + 1000]
        net["probe_from"] = probe_from + len(probe)
        for start in range(0, len(probe), 500):
            for row in session.execute(select(*columns).where(DatasetEvent.id.in_(probe[start : start + 500]))):
                appeared.append(row)
                missing.pop(row.id, None)
        for forgotten in [i for i, at in missing.items() if looked_at - at > forget_after]:
            missing.pop(forgotten)
        for forgotten in sorted(missing)[: max(len(missing) - 10_000, 0)]:  # at most 10 000, the newest
            missing.pop(forgotten)
        if not appeared:
            return
        # the clock read after the look: every event seen committed before it
        slow_before = manager._database_now(session) - latency
        late = net.setdefault("late", [])  # checked at most 50 a look (their consumers' probes), 100 000 kept
        late += [tuple(row) for row in appeared if row.timestamp < slow_before][: 100_000 - len(late)]
        checked, net["late"] = late[:50], late[50:]
        if checked:
            self._find_consumers_of_late_events(net, checked, session)

    def _find_consumers_of_late_events(
        self, net: dict[str, Any], events: list[tuple[Any, ...]], session: Session
    ) -> None:
        """
        Found: each late event's (``id, dataset_id, timestamp``) consumers (DAGs with a dataset-triggered run) that have
        not consumed it and whose next read may start above it (it lies at or below their latest run, or below what
        this process remembers), not below their oldest run (``db clean`` may have deleted the run that consumed it
        since it appeared). Two reads, each a probe per consumer of an event, not per consumer and link.
        """
        from sqlalchemy import true

        from airflow.models.dataset import association_table

        reference = DagScheduleDatasetReference
        latest_run, oldest_run = (self._latest_dataset_run_date(reference.dag_id, oldest) for oldest in (False, True))
        consumers_of: dict[int, list[tuple[str, Any, Any]]] = defaultdict(list)
        for dag_id, dataset_id, latest, oldest in session.execute(
            select(reference.dag_id, reference.dataset_id, latest_run, oldest_run)
            .join(DagModel, DagModel.dag_id == reference.dag_id)
            .where(reference.dataset_id.in_({event[1] for event in events}), DagModel.is_active == true())
        ):
            if latest is not None:
                consumers_of[dataset_id].append((dag_id, latest, oldest))
        consumed = set(
            session.execute(
                select(association_table.c.event_id, DagRun.dag_id)
                .join(DagRun, DagRun.id == association_table.c.dag_run_id)
                .where(association_table.c.event_id.in_([event[0] for event in events]))
            ).all()
        )
        checked: dict[tuple[str, int], tuple[Any, ...]] = self.__dict__.get("_dataset_race_fix_checked", {})
        found: dict[str, dict[int, datetime]] = net["found"]
        for event_id, dataset_id, stamp in events:
            for dag_id, latest, oldest in consumers_of[dataset_id]:
                remembered = checked.get((dag_id, dataset_id), (None, None, None))[2]
                below = stamp <= latest or (remembered and stamp < remembered)
                if (event_id, dag_id) not in consumed and below and stamp >= oldest:
                    stamps = found.setdefault(dag_id, {})
                    stamps[dataset_id] = min(stamps.get(dataset_id, stamp), stamp)

    def _read_dataset_windows_once(
        self, net: dict[str, Any], only: set[str] | None, session: Session, at_once: bool = False
    ) -> None:
        """
        After a start (``only``: explain's DAGs; ``at_once``: no pacing): each reference's window, from its latest run
        less ``event_lookback_seconds`` (never below the DAG's oldest run: ``db clean``'s runs are not given back) to
        that run, read through once for events no run of the DAG consumed, the DAGs whose latest run is oldest first (the
        quiet ones). A step (the references of 10 DAGs, or a slice sized to take about 1 ms) in a loop when the steps
        so far took less than 3 % of the time since the start: the share of the scheduler's time is bounded, not the
        pass's length.
        """
        from sqlalchemy import false, true

        now = time.monotonic()  # the credit: 3 % of the time since the last call, at most 50 ms saved up
        credit = min(net.get("credit", 0.0) + 0.03 * (now - net.get("credit_at", now)), 0.05)
        net["credit_at"] = now
        if only is not None:
            net["windows"], net["pages"] = {}, [sorted(only)]
        elif "pages" not in net:
            if credit <= 0 and not at_once:
                net["credit"] = credit
                return
            started = time.monotonic()
            unpaused = select(DagModel.dag_id).where(DagModel.is_paused == false(), DagModel.is_active == true())
            dag_ids = sorted(session.scalars(unpaused))
            net["windows"], net["pages"] = {}, [dag_ids[i : i + 10] for i in range(0, len(dag_ids), 10)]
            credit -= time.monotonic() - started
        windows, pages = net["windows"], net["pages"]
        while pages and (at_once or credit > 0):
            started = time.monotonic()
            windows.update(self._net_references(set(pages.pop(0)), session))
            credit -= time.monotonic() - started
            if not pages:
                net["window_order"] = sorted(windows, key=lambda key: (windows[key][0], key))
        order = net.get("window_order", [])
        lookback = timedelta(seconds=self._dataset_manager()._dataset_race_fix_setting("event_lookback_seconds"))
        found: dict[str, dict[int, datetime]] = net["found"]
        while order and (at_once or credit > 0):
            (dag_id, dataset_id), size = order[0], net.get("slice_size", 50)
            latest, oldest = windows[(dag_id, dataset_id)]
            start = net.get("cursor") or max(latest - lookback, oldest)
            slice_started = time.monotonic()
            count, newest, stranded = session.execute(
                self._dataset_statement(("window slice",), self._stranded_events_slice),
                {"dataset_id": dataset_id, "start": start, "end": latest, "dag_id": dag_id, "size": size},
            ).one()
            took = time.monotonic() - slice_started
            credit -= took
            if took > 0.001 or took < 0.00025:  # halve or double, 1 to 1 000 events
                net["slice_size"] = max(1, size // 2) if took > 0.001 else min(1000, size * 2)
            if stranded is not None:
                stamps = found.setdefault(dag_id, {})
                stamps[dataset_id] = min(stamps.get(dataset_id, stranded), stranded)
            if count < size or newest is None:
                order.pop(0)
                net["cursor"] = None
            else:  # on from this slice's newest stamp, for its ties (one microsecond on if all share it)
                net["cursor"] = newest if newest > start else newest + timedelta(microseconds=1)
            if not at_once:
                break  # a slice a loop at most
        net["credit"] = credit

    @classmethod
    def _net_references(cls, dag_ids: set[str], session: Session) -> dict[tuple[str, int], tuple[Any, Any]]:
        """
        ``{(dag_id, dataset_id): (latest run, oldest run)}``: the references of the active, unpaused DAGs of
        ``dag_ids`` that have a dataset-triggered run.
        """
        from sqlalchemy import false, true

        reference = DagScheduleDatasetReference
        latest_run, oldest_run = (cls._latest_dataset_run_date(reference.dag_id, oldest) for oldest in (False, True))
        return {
            (dag_id, dataset_id): (latest, oldest)
            for dag_id, dataset_id, latest, oldest in session.execute(
                select(reference.dag_id, reference.dataset_id, latest_run, oldest_run)
                .join(DagModel, DagModel.dag_id == reference.dag_id)
                .where(DagModel.is_paused == false(), DagModel.is_active == true(), latest_run.is_not(None))
                .where(reference.dag_id.in_(dag_ids))
            )
        }

    @staticmethod
    def _latest_dataset_run_date(dag_id: Any, oldest: bool = False) -> Any:
        """
        The date of the latest (``oldest``: the oldest) dataset-triggered run of the DAG ``dag_id`` (a correlated
        column), a scalar subquery: its newest (oldest) run's if that one is dataset-triggered, else searched for
        (COALESCE evaluates the second only then). ORDER BY .. LIMIT 1, not max(): for a correlated max() with a filter
        MySQL reads every run. That run has no filter to misjudge: filtered on run_type, statistics taken before a bulk
        load chose a bitmap scan of all the DAG's runs and a sort (issue 30). Nothing is read below the oldest:
        ``airflow db clean`` deletes a DAG's older runs, whose events are not unconsumed ones (issue 47).
        """
        from sqlalchemy import case

        order = DagRun.execution_date.asc() if oldest else DagRun.execution_date.desc()
        first_if_dataset_triggered = (
            select(case((DagRun.run_type == DagRunType.DATASET_TRIGGERED, DagRun.execution_date)))
            .where(DagRun.dag_id == dag_id)
            .order_by(order)
            .limit(1)
            .scalar_subquery()
        )
        searched = (
            select(DagRun.execution_date)
            .where(DagRun.dag_id == dag_id, DagRun.run_type == DagRunType.DATASET_TRIGGERED)
            .order_by(order)
            .limit(1)
            .scalar_subquery()
        )
        return func.coalesce(first_if_dataset_triggered, searched)

    @classmethod
    def _stranded_events_slice(cls) -> Any:
        """
        One slice of one reference (``dataset_id``, stamps ``start`` to ``end``, ``dag_id``, ``size`` events at
        most): how many events it read, the newest stamp among them, and the oldest that no run of the DAG consumed,
        not below the DAG's oldest run as it is now (``db clean`` may have deleted runs since the pass began).
        """
        from sqlalchemy import bindparam, case

        from airflow.models.dataset import association_table

        event = select(DatasetEvent.id, DatasetEvent.timestamp).where(
            DatasetEvent.dataset_id == bindparam("dataset_id"),
            DatasetEvent.timestamp >= bindparam("start"),
            DatasetEvent.timestamp <= bindparam("end"),
        )
        piece = event.order_by(DatasetEvent.timestamp).limit(bindparam("size")).subquery()
        # Each link's run by primary key, a scalar subquery: no plan can start from the DAG's runs per event.
        run_of_link = select(DagRun.dag_id).where(DagRun.id == association_table.c.dag_run_id).scalar_subquery()
        consumed = (
            select(association_table.c.event_id)
            .where(association_table.c.event_id == piece.c.id, run_of_link == bindparam("dag_id"))
            .exists()
        )
        oldest_run = cls._latest_dataset_run_date(bindparam("dag_id"), oldest=True)
        unconsumed = func.min(case((and_(~consumed, piece.c.timestamp >= oldest_run), piece.c.timestamp)))
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
        # DAGs the net found a late commit for: their next decision reads from its stamp.
        net_found: dict[str, dict[int, datetime]] = self.__dict__.get("_dataset_race_fix_net", {}).get("found", {})
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
            latest_run_date, latest_interval_end, latest_any_run_date, oldest_run_date = state.latest_runs.get(
                dag.dag_id, (None,) * 4
            )
            dataset_ids = sorted(state.dataset_ids_of[dag.dag_id])
            found_late = net_found.pop(dag.dag_id, {}) if latest_run_date is not None else {}
            below_clock = None  # the clock behind the latest run (stepped back): read from the run before it, as stock
            if latest_run_date is not None and latest_run_date > state.database_now:
                below_clock = session.scalar(
                    select(DagRun.execution_date)
                    .where(DagRun.dag_id == dag.dag_id, DagRun.run_type == DagRunType.DATASET_TRIGGERED)
                    .where(DagRun.execution_date <= state.database_now)
                    .order_by(DagRun.execution_date.desc())
                    .limit(1)
                )
            floors = self._dataset_floors(
                dataset_ids, latest_run_date, state.database_now, queued,
                state.newest_consumed.get(dag.dag_id, {}), found_late, lookback, commit_latency,
                self._checked_dataset_floors(dag.dag_id, dataset_ids, state.database_now, latest_run_date), below_clock,
                oldest_run_date,
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
        latest_runs: dict[str, tuple[Any, ...]] = {}  # run date, interval end, any run's date, oldest run's date
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
                cls._latest_dataset_run_date(DagModel.dag_id, oldest=True),
                clock_column,
                DatasetModel.id,
                DatasetModel.uri,
                newest_consumed_by_latest_run,
            )
            .outerjoin(reference, reference.dag_id == DagModel.dag_id)
            .outerjoin(DatasetModel, DatasetModel.id == reference.dataset_id)
            .where(DagModel.dag_id.in_(bindparam("dag_ids", expanding=True)))
        )

    @classmethod
    def _postgres_runs_and_datasets_statement(cls, reference: Any, clock_column: Any) -> Any:
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
                cls._latest_dataset_run_date(DagModel.dag_id, oldest=True),
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
        found_late: dict[int, datetime],
        lookback: timedelta,
        commit_latency: timedelta,
        checked: dict[int, datetime] | None = None,
        below_clock: datetime | None = None,
        oldest_run_date: datetime | None = None,
    ) -> _DatasetFloors:
        """
        Where a DAG reads each dataset's events from (BUG_REPORT, "The floor"); pure. ``found_late``: per dataset, the
        oldest late commit the net found (read from there). ``checked``: per dataset, where this process's last read of
        it left nothing unconsumed to find (``_remember_dataset_reads``); it raises the newest consumed event's floor,
        never a queue row's. A latest run ahead of the clock (a clock stepped back) reads in full, from
        ``below_clock``, the latest run at or before the clock, as stock's window would. Else nothing is read below the
        DAG's oldest run (``oldest_run_date``): ``airflow db clean`` deleted the runs that consumed what lies there.
        """
        if latest_run_date is None:  # no run of this DAG has consumed anything yet
            return cls._DatasetFloors({}, None, True)
        full_read = latest_run_date > database_now
        full_from = (below_clock or database_now) if full_read else latest_run_date
        full_floor = min([full_from, database_now, *queued.values()]) - lookback
        # db clean's runs lay below the oldest: a queue row or a late commit the net found reads there, nothing else
        # (a clock behind every run reads below them all: what it stamps lies there)
        kept_from = full_floor if full_read or oldest_run_date is None else max(full_floor, oldest_run_date)
        checked = checked or {}
        floors: dict[int, datetime] = {}
        for dataset_id in dataset_ids:
            newest = newest_consumed.get(dataset_id)
            if full_read or newest is None:
                floor = kept_from
            else:
                floor = max(newest - commit_latency, checked.get(dataset_id, kept_from), kept_from)
            if dataset_id in queued:  # a row written after the oldest run brings no event from below it (db clean's)
                row = queued[dataset_id]
                floor = min(floor, max(row - commit_latency, kept_from if row > kept_from else row - commit_latency))
            if dataset_id in found_late:
                floor = min(floor, found_late[dataset_id])
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
