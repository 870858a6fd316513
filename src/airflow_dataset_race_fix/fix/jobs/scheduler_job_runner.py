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

Per DAG, ``_decide_dataset_triggered_runs`` (read-only: explain runs it too) reads a floor per dataset,
the events above it no run of the DAG consumed, and the run they make; the queue rows read are deleted
as read at the end of the loop. The sweep brings in DAGs whose new events have no queue row, the net
late commits below a DAG's latest run. Why: BUG_REPORT.md section 4 ("Scheduler: consume what is
unconsumed", "Lock discipline", "A stalled producer") and section 6 ("The floor", "The net").
Nothing here commits (the scheduler's own transaction, as before). Every global below must name the
same object in ``airflow.jobs.scheduler_job_runner``; settings: ``DatasetManager._dataset_race_fix_settings``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Collection

from airflow.models import Log
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
from sqlalchemy import and_, delete, func, or_, select

if TYPE_CHECKING:
    from datetime import datetime

    from airflow.utils.sqlalchemy import CommitProhibitorGuard
    from sqlalchemy.orm import Session


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
        # and the DAGs the sweep and the net bring in, decided alike: before this loop writes (the net commits
        # its finds on a connection of its own, which SQLite's one writer would make wait behind this loop)
        dataset_triggered_dags += self._dags_with_unqueued_dataset_events(dataset_triggered_dag_info, session)
        self._create_dag_runs(non_dataset_dags, session)
        if dataset_triggered_dags:
            self._create_dag_runs_dataset_triggered(
                dataset_triggered_dags, dataset_triggered_dag_info, session
            )

        # commit the session - Release the write lock on DagModel table.
        guard.commit()
        # END: create dagruns

    @staticmethod
    def _dataset_manager() -> Any:
        """Airflow's DatasetManager, whose members give these steps clock and settings (explain's: ours)."""
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
        """An event as the decision reads it: the columns it counts and dates by, no ORM object."""

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

    @dataclass
    class _DatasetDecisionState:
        """What ``_decide_dataset_triggered_runs`` reads for all its DAGs before deciding any."""

        queued_rows: dict[str, dict[int, datetime]]  # dag_id -> dataset_id -> created_at
        stored_as_read: dict[tuple[int, str], Any]  # (dataset_id, dag_id) -> created_at as stored
        dataset_ids_of: dict[str, set[int]]  # scheduled on, or named by a queue row
        dataset_uris: dict[int, str]
        newest_consumed: dict[str, dict[int, datetime]]  # by the DAG's latest run, per dataset
        # latest dataset-triggered run's date and interval end, any run's date, oldest dataset-triggered run's
        latest_runs: dict[str, tuple[Any, ...]]
        database_now: datetime | None

    @dataclass
    class _DatasetDecision:
        """
        A DAG's decision (``_decide_dataset_triggered_runs``; explain and the list page read it too), which
        ``_create_dag_runs_dataset_triggered`` carries out. A run: ``execution_date`` set (and the two after
        it), never with ``skipped``; ``choice`` and ``findings_done`` are None when skipped before its read.
        """

        dag_id: str
        dag: Any = None
        choice: SchedulerJobRunner._DatasetRunChoice | None = None  # what its events decide
        findings_done: list[tuple[int, list[int]]] | None = None  # the net's: (dataset_id, log row ids)
        execution_date: datetime | None = None  # the run's; None: no run
        data_interval: Any = None
        run_id: str | None = None
        skipped: str | None = None  # why the loop skips the DAG

    @dataclass(frozen=True)
    class _DatasetCheckedRead:
        """
        A DAG's last read of a dataset here (``_remember_dataset_reads``), by (dag_id, dataset_id) in the
        runner's ``_dataset_race_fix_checked``, all forgotten past 100 000: below ``floor`` it left nothing
        unconsumed, and only a late commit (the net's) lands there after. Trusted while the clock is not back
        below ``read_at`` and the latest run not older than ``run_date`` (``_checked_dataset_floors``).
        """

        read_at: datetime  # the database's clock before the read
        run_date: datetime | None  # the DAG's latest dataset-triggered run's date then
        floor: datetime  # the lowest event left, or ``read_at`` less the commit latency

    @dataclass
    class _DatasetSweep:
        """
        The sweep's rounds here, made and moved by ``_dags_with_unqueued_dataset_events``: one starts an
        interval after the last began and reads its DAGs (and the clock, ``now``, if it has some), then a
        page of ``size`` while ``credit`` allows, in a loop where the net looked (a backstop round while the
        net is quiet: nine loops after the last page) or twenty loops after it. A round reads every DAG only
        if something may have changed since the last one began (``full``): else only the DAGs new since.
        Between loops, a round is on iff ``todo`` has DAGs.
        """

        at: float  # when the last round began (monotonic); made: now, so that the first is one interval away
        now: datetime | None = None  # the database's clock when the last round with DAGs to read began
        todo: list[str] | None = None  # the round's DAGs not read yet; None: no round yet
        full: bool = True  # the round reads every DAG, not only those new since the last round
        dag_ids: frozenset[str] | None = None  # the DAGs the last round had; None: no round yet
        changes: int = -1  # the net's ``changes`` when the last round began
        found: bool = False  # the last (or this) round brought in a DAG
        full_at: float = float("-inf")  # when the last full round began (monotonic)
        backstop: bool = False  # the round reads every DAG for its 30 intervals alone: its pages slower
        size: int = 50  # DAGs a page, 5 to 50, sized to take 1-2 ms
        credit: float = 0.0  # seconds a page may take now: below 0, none; at most 2 ms saved up
        credit_at: float | None = None  # when ``credit`` last earned (monotonic)
        loops: int = 20  # loops since the last page

        def earn_credit(self) -> float:
            """``credit``, 3 % of the time since the last call earned (10 ms saved up made page bursts)."""
            now = time.monotonic()
            since = 0.0 if self.credit_at is None else now - self.credit_at
            self.credit, self.credit_at = min(self.credit + 0.03 * since, 0.002), now
            return self.credit

    class _DatasetNet:
        """
        The net's state in this process (BUG_REPORT, "The net"), moved by its looks (explain's: read-only,
        no look); the runs that consume findings drop them. Every id up to ``high`` was read by a look (or the
        processes before, from their mark; a first start: all but the last 10 000), is in ``missing`` or was
        given up (counted: past the caps or the look-back; not: a jump of over 5 000 ids); one read late stays
        in ``late`` until classified, in ``below`` until its links are read. A look is undone (``copy_look``,
        ``undo_look``) unless its finds are kept.
        """

        __slots__ = ("read_only", "findings", "findings_at", "findings_after", "high", "missing", "late")
        __slots__ += ("below", "looked_at", "backlog_to", "unmarked_to", "quiet", "probe_from", "probe_size")
        __slots__ += ("mark_id", "marked", "marked_at", "changes", "newest_stamp", "read_from")

        def __init__(self, read_only: bool = False) -> None:
            self.read_only = read_only  # explain's: no look, nothing written, the findings read
            self.findings: dict[str, dict] | None = None  # as ``_dataset_findings`` last read; None: unread
            self.findings_at = float("-inf")  # when (monotonic)
            self.findings_after = 0  # the last id of the last read, if it read a full page of 500
            self.high: int | None = None  # the highest id followed; None: no look yet
            self.missing: dict[int, float] = {}  # id -> when first missed (monotonic), at most 10 000
            self.late: list[tuple[int, int, datetime]] = []  # (id, dataset_id, stamp), at most 100 000
            self.below: list[tuple[int, int, datetime]] = []  # late, below a consumer's run: links not read
            self.looked_at = float("-inf")  # when the last look began (monotonic)
            self.quiet = False  # nothing appeared at the last look, and nothing waits: the next is later
            self.backlog_to = 0  # the newest id at the first look: up to it, every event counts as late
            self.unmarked_to = 0  # a first start's (no mark): up to it, only events no run consumed count
            self.probe_from = 500  # where the next look probes the older missing ids
            self.probe_size = 10  # events of ``below`` whose links a look reads: 5 to 1 000, sized to 1-2 ms
            self.mark_id: int | None = None  # the ``log`` row of this process's mark
            self.marked: tuple[int, list[int]] | None = None  # the mark last written: high, missing ids
            self.marked_at = float("-inf")  # when (monotonic)
            # events the looks read, and ids given up: the sweep reads every DAG when it moved
            self.changes = 0
            self.newest_stamp: datetime | None = None  # the newest stamp a look read (one dated ahead waits)
            # where the next loop reads DAGs with findings from their serialization, 20 a loop
            self.read_from = 0

        def copy_look(self) -> tuple[Any, ...]:
            """What a look moves (``missing`` and ``late`` change in place): for ``undo_look``."""
            return self.high, self.missing.copy(), self.late.copy(), self.below.copy(), self.looked_at

        def undo_look(self, copied: tuple[Any, ...]) -> None:
            self.high, self.missing, self.late, self.below, self.looked_at = copied

    def _dags_with_unqueued_dataset_events(
        self, dataset_triggered_dag_info: dict[str, tuple[datetime, datetime]], session: Session
    ) -> list[DagModel]:
        """The DAGs that the net (every loop) and the sweep (BUG_REPORT, "A stalled producer") bring in."""
        manager = self._dataset_manager()
        interval = manager._dataset_race_fix_setting("requeue_interval_seconds")
        loop_began = time.monotonic()
        stranded = self._dags_with_stranded_dataset_events(session)
        oldest_new = {
            dag_id: stamp for dag_id, stamp in stranded.items() if dag_id not in dataset_triggered_dag_info
        }
        # paced, the first page is of 10 DAGs (one of 50 took 20 ms at 100 consumers, tables never analyzed)
        first_size = 10 if interval else 50
        sweep = self.__dict__.setdefault(
            "_dataset_race_fix_sweep", self._DatasetSweep(time.monotonic(), size=first_size)
        )
        # a page while 3 % of the time allows, sized to 1-2 ms, in a loop where the net looked (a backstop
        # round while the net is quiet: nine loops after the last page), or twenty loops after it: an idle
        # scheduler's loop a second keeps its median (a loop in ten pays a page, one in five a look); tests:
        # every loop
        sweep.loops += 1
        net = self._dataset_race_fix_net
        slower = sweep.backstop and net.quiet and sweep.loops < 9
        due = (net.looked_at >= loop_began and not slower) or sweep.loops >= 20
        paced = interval > 0 and (sweep.earn_credit() < 0 or not due)
        began = None  # when this loop's step of the sweep began; None: no step
        if not paced and (sweep.todo or time.monotonic() - sweep.at >= interval):
            began, sweep.loops = time.monotonic(), 0
            if not sweep.todo:  # a round starts: its DAGs read, and the clock if it has some to read
                self._start_sweep_round(sweep, interval, session)
        if began is not None and sweep.todo:
            found = self._dags_with_new_unqueued_events(dataset_triggered_dag_info, sweep.now, session, sweep)
            if interval:  # a page sized by its time (tests: pages of 50, a round every loop)
                took = time.monotonic() - began
                if took > 0.002:
                    sweep.size = max(5, sweep.size // 2)
                elif took < 0.001:
                    sweep.size = min(50, sweep.size * 2)
            sweep.found = sweep.found or bool(found)
            for dag_id, stamp in found.items():
                oldest_new[dag_id] = min(oldest_new.get(dag_id, stamp), stamp)
        if began is not None and interval:  # paced: the step's time spent from the credit
            sweep.credit -= time.monotonic() - began
        runnable = self._runnable_dataset_dags(oldest_new, session) if oldest_new else []
        for dag_model in runnable:
            dataset_triggered_dag_info[dag_model.dag_id] = (oldest_new[dag_model.dag_id],) * 2
        if runnable:
            self.log.info(
                "%d dataset-scheduled DAG(s) have dataset events that no queue row brings in; deciding their "
                "runs: %s",
                len(runnable),
                [dm.dag_id for dm in runnable],
            )
        return runnable

    def _start_sweep_round(self, sweep: _DatasetSweep, interval: float, session: Session) -> None:
        """
        A round starts. It reads every DAG if since the last began the net read an event or gave an id up, the
        last found a DAG, an event the net read was dated past its horizon, or 30 intervals passed (what
        nothing here sees: a stock scheduler's delete, a row deleted by hand: a backstop, paced slower);
        else the DAGs new since (one unpaused). It reads its DAGs, and the clock only if it has some: an
        idle round is one statement.
        """
        manager, net = self._dataset_manager(), self._dataset_race_fix_net
        ahead = timedelta(seconds=manager._dataset_race_fix_setting("max_event_ahead_seconds"))
        dated_past = (
            sweep.now is not None and net.newest_stamp is not None and net.newest_stamp > sweep.now + ahead
        )
        began = time.monotonic()
        changed = not interval or sweep.dag_ids is None or net.changes != sweep.changes or sweep.found
        sweep.full = changed or dated_past or began - sweep.full_at >= 30 * interval
        sweep.backstop = not (changed or dated_past) and sweep.full
        if sweep.full:
            sweep.full_at = began
        sweep.at, sweep.changes, sweep.found = began, net.changes, False
        dag_ids, _ = self._dataset_statement(("sweep", False), lambda: self._sweep_statement(sweep))
        round_dag_ids = session.connection().execute(dag_ids).scalars().all()
        known, sweep.dag_ids = sweep.dag_ids or frozenset(), frozenset(round_dag_ids)
        sweep.todo = [dag_id for dag_id in round_dag_ids if sweep.full or dag_id not in known]
        if sweep.todo:  # its pages read against the clock at its start (else the last round's is kept)
            sweep.now = manager._database_now(session)

    def _dags_with_new_unqueued_events(
        self,
        dataset_triggered_dag_info: dict[str, tuple[datetime, datetime]],
        now: datetime,
        session: Session,
        sweep: _DatasetSweep | None = None,
    ) -> dict[str, datetime]:
        """
        The sweep: ``{dag_id: oldest such stamp}`` of the other DAGs whose newest event without a queue row is
        newer than their latest run (no run: than the reference) and than ``event_lookback_seconds``; of the
        next ``sweep.size`` DAGs of its round (``sweep.todo``), or of all DAGs (explain).
        """
        manager = self._dataset_manager()
        horizon = now + timedelta(seconds=manager._dataset_race_fix_setting("max_event_ahead_seconds"))
        since = now - timedelta(seconds=manager._dataset_race_fix_setting("event_lookback_seconds"))
        _, references = self._dataset_statement(
            ("sweep", sweep is None), lambda: self._sweep_statement(sweep)
        )
        params, oldest_new = {"horizon": horizon}, {}  # (Core rows here and below: an ORM row costs 10 µs)
        if sweep is not None:  # a page of the round: one statement (a page's own read cost as much again)
            params["dag_ids"], sweep.todo = sweep.todo[: sweep.size], sweep.todo[sweep.size :]
            if not params["dag_ids"]:
                return oldest_new
        # compared here, not in SQL: PostgreSQL evaluated the correlated ``newest`` once per use, three times
        for dag_id, newest, latest, created_at in session.connection().execute(references, params):
            if dag_id not in dataset_triggered_dag_info and (newest or since) > max(
                latest or created_at, since
            ):
                oldest_new[dag_id] = min(oldest_new.get(dag_id, newest), newest)
        return oldest_new

    @classmethod
    def _sweep_statement(cls, sweep: _DatasetSweep | None) -> tuple[Any, Any]:
        """
        The sweep's: unpaused active DAGs with references (``sweep``; explain: none); per reference of those
        in ``dag_ids`` (explain: all) with no queue row, its newest event to ``horizon``, latest run, date.
        """
        from sqlalchemy import bindparam, false, true

        reference = DagScheduleDatasetReference
        # ORDER BY .. LIMIT 1: a correlated max() with a filter read every event of the dataset on MySQL.
        newest = select(DatasetEvent.timestamp).where(DatasetEvent.dataset_id == reference.dataset_id)
        newest = newest.where(DatasetEvent.timestamp <= bindparam("horizon")).order_by(
            DatasetEvent.timestamp.desc()
        )
        queued = select(DatasetDagRunQueue.dataset_id).where(
            DatasetDagRunQueue.dataset_id == reference.dataset_id
        )
        queued = queued.where(DatasetDagRunQueue.target_dag_id == reference.dag_id)
        references = select(reference.dag_id, newest.limit(1).scalar_subquery())
        references = references.add_columns(
            cls._latest_dataset_run_date(reference.dag_id), reference.created_at
        )
        active = and_(
            DagModel.dag_id == reference.dag_id, DagModel.is_paused == false(), DagModel.is_active == true()
        )
        references = references.join(DagModel, active).where(~queued.exists())  # (unpaused, active DAGs)
        if sweep is None:
            return None, references
        # the page bound by its ids (a list, not joined: a derived table got seq scans of events, stale stats)
        dag_ids = select(reference.dag_id).distinct().join(DagModel, active).order_by(reference.dag_id)
        return dag_ids, references.where(reference.dag_id.in_(bindparam("dag_ids", expanding=True)))

    def _runnable_dataset_dags(
        self, oldest_new: dict[str, datetime], session: Session, *, lock_rows: bool = True
    ) -> list[DagModel]:
        """
        Of ``oldest_new``'s DAGs, at most ``max_dagruns_to_create_per_loop`` that can run, oldest event first,
        locked ``SKIP LOCKED`` as ``dags_needing_dagruns`` does (explain: no lock).
        """
        from sqlalchemy import false, true

        dag_ids, can_run = sorted(oldest_new), []
        for start in range(0, len(dag_ids), 500):
            chunk = dag_ids[start : start + 500]
            running = DagRun.state.in_((DagRunState.QUEUED, DagRunState.RUNNING))
            runs = (
                select(DagRun.dag_id, func.count())
                .where(DagRun.dag_id.in_(chunk), running)
                .group_by(DagRun.dag_id)
            )
            active_runs = dict(session.execute(runs).all())
            for dag_id, is_paused, has_import_errors, max_active_runs in session.execute(
                select(
                    DagModel.dag_id, DagModel.is_paused, DagModel.has_import_errors, DagModel.max_active_runs
                ).where(DagModel.dag_id.in_(chunk), DagModel.is_active == true())
            ):
                room = max_active_runs is None or active_runs.get(dag_id, 0) < max_active_runs
                if room and not is_paused and not has_import_errors:  # one that cannot run takes no place
                    can_run.append(dag_id)
        picked = sorted(can_run, key=lambda dag_id: (oldest_new[dag_id], dag_id))[
            : DagModel.NUM_DAGS_PER_DAGRUN_QUERY
        ]
        if not picked:
            return []
        runnable_dags = select(DagModel).where(DagModel.dag_id.in_(picked), DagModel.is_paused == false())
        if lock_rows:
            runnable_dags = with_row_locks(runnable_dags, of=DagModel, session=session, skip_locked=True)
        return sorted(session.scalars(runnable_dags).all(), key=lambda dm: (oldest_new[dm.dag_id], dm.dag_id))

    def _dags_with_stranded_dataset_events(self, session: Session) -> dict[str, datetime]:
        """
        The net (BUG_REPORT): ``{dag_id: oldest such stamp}`` of the DAGs with a finding (an unconsumed event
        below where their next read starts) whose condition holds with it; a look a loop if its interval is 0.
        """
        net = self.__dict__.setdefault("_dataset_race_fix_net", self._DatasetNet())
        interval = self._dataset_manager()._dataset_race_fix_setting("net_look_interval_seconds")
        # after a look at which nothing appeared and nothing waits, the next ten intervals on: an idle
        # scheduler's loop a second keeps its median (the first events after that can count as late: a probe)
        wait = 10 * interval if net.quiet else interval
        looked = not net.read_only and time.monotonic() - net.looked_at >= wait
        before = net.copy_look() if looked else None  # (copied in a loop that looks only)
        try:
            finds = self._follow_dataset_event_ids(net, session) if looked else []
            # read again by a look that found some, while some wait, or every ten waits between looks (another
            # process's: 5 s, 50 s when quiet): an idle look is one statement, and nine in ten read no more
            stale = time.monotonic() - net.findings_at >= 10 * wait
            if net.findings is None or looked and (finds or net.findings or stale):
                self._dataset_findings(finds, net, session)
                net.findings_at = time.monotonic()
        except BaseException:  # a look is undone until its findings are kept: the retried loop looks again
            if before is not None:
                net.undo_look(before)
            raise
        if looked:  # after the findings are kept: a restart never starts above a find that was not
            net.quiet = net.high == before[0] and not net.late and not net.missing
            self._dataset_follow_mark(net, session)
        return self._dags_ready_by_findings(net, session)

    def _dataset_findings(
        self, finds: list[tuple[str, int, int, datetime]], net: _DatasetNet, session: Session
    ) -> None:
        """
        Findings kept until the run that consumes them commits (BUG_REPORT, "The net"): ``finds`` (dag_id,
        dataset_id, event_id, stamp), the oldest per DAG and dataset, committed on a connection of their own
        (a new ``log`` row locks nothing others wait for); then ``net.findings`` read: 500 from where the
        last read ended (then from the first again), so that 500 that wait (an AND condition, a DAG gone)
        hide no other.
        """
        oldest: dict[tuple[str, int], tuple[datetime, int]] = {}
        finding = "dataset-race-fix-finding"
        for dag_id, dataset_id, event_id, stamp in finds:
            oldest[dag_id, dataset_id] = min(
                oldest.get((dag_id, dataset_id), (stamp, event_id)), (stamp, event_id)
            )
        if oldest:
            rows = [
                {
                    "dttm": timezone.utcnow(),
                    "event": finding,
                    "dag_id": dag_id,
                    "map_index": dataset_id,
                    "execution_date": stamp,
                    "extra": f'{{"event_id": {int(event_id)}}}',
                }
                for (dag_id, dataset_id), (stamp, event_id) in sorted(oldest.items())
            ]
            with session.get_bind().engine.begin() as connection:
                connection.execute(Log.__table__.insert(), rows)
            self.log.info(
                "dataset-race-fix: the net found late dataset event(s), kept until a run consumes them "
                "(dag_id, dataset_id, event id, stamp): %s",
                finds,
            )
        findings: dict[str, dict[int, tuple[datetime, list[int]]]] = defaultdict(dict)
        read = select(Log.id, Log.dag_id, Log.map_index, Log.execution_date).where(Log.event == finding)
        rows = session.execute(read.where(Log.id > net.findings_after).order_by(Log.id).limit(500)).all()
        for row_id, dag_id, dataset_id, stamp in rows:
            found_stamp, row_ids = findings[dag_id].get(dataset_id, (stamp, []))
            findings[dag_id][dataset_id] = (min(found_stamp, stamp), [*row_ids, row_id])
        net.findings = findings
        net.findings_after = rows[-1][0] if len(rows) == 500 else 0  # a full page: the next reads on after it

    def _dags_ready_by_findings(self, net: _DatasetNet, session: Session) -> dict[str, datetime]:
        """Of the DAGs with findings, those whose condition holds on the datasets with a finding or queue row
        (an AND condition still waiting takes no place in a loop: its finding waits for the partner's row)."""
        # (a DAG whose findings a run consumed since they were read has none left)
        findings = net.findings or {}
        dag_ids = sorted(dag_id for dag_id, found in findings.items() if found)
        if not dag_ids:  # at most 500 (``_dataset_findings``), and their datasets: a query each
            return {}
        # At most 20 DAGs a loop read from their serialization, in turn: a new process's dag bag holds none,
        # and 300 DAGs with findings after a stop took 750 ms of its first loop (explain: every one). Gone
        # DAGs (``delete_dag`` keeps their findings: they wait in the table) are not read then.
        unread = [dag_id for dag_id in dag_ids if dag_id not in self.dagbag.dags]
        if len(unread) > 20 and not net.read_only:
            known = set(session.scalars(select(DagModel.dag_id).where(DagModel.dag_id.in_(unread))))
            in_turn = [dag_id for dag_id in unread if dag_id in known]
            start = net.read_from % max(1, len(in_turn))
            later = set(unread) - set((in_turn[start:] + in_turn[:start])[:20])
            dag_ids, net.read_from = [dag_id for dag_id in dag_ids if dag_id not in later], start + 20
        queued: dict[str, set[str]] = defaultdict(set)  # their queue rows' dataset URIs
        rows = select(DatasetDagRunQueue.target_dag_id, DatasetModel.uri).join(DatasetDagRunQueue.dataset)
        for dag_id, uri in session.execute(rows.where(DatasetDagRunQueue.target_dag_id.in_(dag_ids))):
            queued[dag_id].add(uri)
        found = select(DatasetModel.id, DatasetModel.uri).where(
            DatasetModel.id.in_(set().union(*findings.values()))
        )
        uris = dict(session.execute(found).all())
        ready = {}
        for dag_id in dag_ids:
            dag = self.dagbag.get_dag(dag_id, session=session)
            if dag is None or not isinstance(dag.timetable, DatasetTriggeredTimetable):
                continue  # gone, or scheduled otherwise now: its findings wait in the table
            statuses = dict.fromkeys(queued[dag_id] | {uris[i] for i in findings[dag_id] if i in uris}, True)
            try:
                if not dag.timetable.dataset_condition.evaluate(statuses):
                    continue
            except AttributeError:  # serialized before 2.9: skipped, as dags_needing_dagruns does
                continue
            ready[dag_id] = min(stamp for stamp, _ in findings[dag_id].values())
        return ready

    def _follow_dataset_event_ids(
        self, net: _DatasetNet, session: Session
    ) -> list[tuple[str, int, int, datetime]]:
        """
        The net's look at the ids visible since the last (BUG_REPORT, "The net"): a late event's consumers
        that did not consume it and whose next read may start above it, as (dag_id, dataset_id, id, stamp).
        """
        from airflow.models.dataset import association_table

        manager = self._dataset_manager()
        forget_after = manager._dataset_race_fix_setting("event_lookback_seconds")
        latency = timedelta(seconds=manager._dataset_race_fix_setting("commit_latency_seconds"))
        columns = (DatasetEvent.id, DatasetEvent.dataset_id, DatasetEvent.timestamp)
        missing = net.missing  # (changed in place: the look's copy is the caller's)
        looked_at, high, new_process = time.monotonic(), net.high, net.high is None
        # a new process reads and classifies its backlog before its first decisions make runs above it
        span = 50_000 if new_process else 5_000
        net.looked_at = looked_at
        if new_process:  # the ids up to the newest are a backlog, whose commit nobody saw
            net.backlog_to = session.scalar(select(func.max(DatasetEvent.id))) or 0
            followed = self._dataset_follow_mark(net, session)
            if followed is None:  # a first start (a stock history, marks deleted): BUG_REPORT, "The net"
                followed, net.unmarked_to = {"high": max(0, net.backlog_to - 10_000)}, net.backlog_to
            # on from the newest mark; a first start: the last 10 000 ids again
            net.high = high = followed["high"]
            missing.update(dict.fromkeys(followed.get("missing", ()), looked_at - followed.get("age", 0)))
        # At most ``span`` new and 1 000 missing ids a loop: a backlog is read in the loops after. The
        # lowest new id by min() (the key's index whatever the statistics: an open range scanned tables never
        # analyzed)
        first = session.scalar(select(func.min(DatasetEvent.id)).where(DatasetEvent.id > high))
        new_ids = select(*columns).where(DatasetEvent.id.between(first or 0, (first or 0) + span - 1))
        rereading = first is not None and first <= net.unmarked_to  # a first start's re-read
        if rereading:  # whether a run consumed each: one index probe an event (the first link found; LIMIT 1,
            # correlated: an EXISTS was planned as a hashed scan of every link, tables never analyzed)
            linked = select(association_table.c.event_id).where(
                association_table.c.event_id == DatasetEvent.id
            )
            new_ids = new_ids.add_columns(linked.correlate(DatasetEvent).limit(1).scalar_subquery())
        appeared = session.connection().execute(new_ids.order_by(DatasetEvent.id)).all() if first else []
        consumed_by_some = {
            row.id for row in appeared if rereading and row[3] is not None and row.id <= net.unmarked_to
        }
        # (a jump in the ids: missing are at most the ``span`` above the highest seen and below the newest)
        if appeared:
            last = net.high = appeared[-1].id
            gaps = set(range(high + 1, min(high + span + 1, last))) | set(
                range(max(high + 1, last - span), last)
            )
            missing.update(dict.fromkeys(gaps - {row.id for row in appeared}, looked_at))
        # the 500 missed last (in flight: they commit soon), and 500 others in turn (a rollback never does)
        waiting = sorted(missing, key=lambda i: (-missing[i], -i))
        probe_from = net.probe_from if net.probe_from < len(waiting) else 500
        probe = waiting[:500] + waiting[probe_from : probe_from + 500]
        net.probe_from = probe_from + 500
        for start in range(0, len(probe), 500):
            probed = select(*columns).where(DatasetEvent.id.in_(probe[start : start + 500]))
            for row in session.connection().execute(probed):
                appeared.append(row)
                missing.pop(row.id, None)
        recent = sorted(i for i, at in missing.items() if looked_at - at <= forget_after)
        net.missing = {i: missing[i] for i in recent[-10_000:]}  # the newest
        late = net.late  # classified 5 000 a look, 100 000 kept
        net.changes += len(appeared)
        if appeared:  # the clock read after the look: every event seen committed before it
            newest = max(row.timestamp for row in appeared)
            net.newest_stamp = newest if net.newest_stamp is None else max(net.newest_stamp, newest)
            slow_before = manager._database_now(session) - latency
            late += [
                tuple(row)[:3]
                for row in appeared
                if (row.timestamp < slow_before or row.id <= net.backlog_to)
                and row.id not in consumed_by_some
            ]
        aged = len(missing) - len(recent)  # rolled back, or a COMMIT beyond reach (docs/settings.md)
        capped = max(0, len(recent) - 10_000) + max(0, len(late) - 100_000)
        if aged or capped:
            net.changes += aged + capped
            Stats.incr("dataset_race_fix.net_ids_dropped", aged + capped)
            self.log.info(
                "dataset-race-fix: the net no longer follows %d id(s) missing for event_lookback_seconds "
                "and drops %d past its caps",
                aged,
                capped,
            )
        if len(late) > 100_000:  # the late events past the cap are read again, as new, when the net is there
            net.high = min(net.high, min(event[0] for event in late[100_000:]) - 1)
        # Late events classified ``span`` a look (5 000; a new process's first: 50 000), from both ends of the
        # queue: the oldest (a restart's backlog, in id order) and the newest (a commit late now) wait for no
        # others. Their datasets' consumers are read once (a cost by datasets, not events): one above every
        # consumer's latest run needs no more (after a restart most are). One below waits in ``net.below``
        # for its links' read: 5 to 1 000 a look, sized to take 1-2 ms, from both ends too (at most 100 000:
        # a batch only while there is room).
        batch, net.late = self._both_ends(late[:100_000], min(span, 100_000 - len(net.below)))
        consumers_of = self._dataset_consumers(sorted({event[1] for event in batch}), session)
        highest = {dataset_id: max(c[1] for c in consumers) for dataset_id, consumers in consumers_of.items()}
        below = net.below + [
            event
            for event in batch
            if event[1] in highest
            and event[2] <= highest[event[1]]
            and any(old <= event[2] <= top for _, top, old in consumers_of[event[1]])
        ]
        size = net.probe_size
        events, net.below = self._both_ends(below, size)
        if not events:
            return []
        started = time.monotonic()
        consumers_of.update(
            self._dataset_consumers(sorted({event[1] for event in events} - set(consumers_of)), session)
        )
        found = [
            (dag_id, dataset_id, event_id, stamp)
            for event_id, dataset_id, stamp in events
            for dag_id, top, oldest in consumers_of[dataset_id]
            if oldest <= stamp <= top
        ]
        link = association_table.c
        links = select(link.event_id, DagRun.dag_id).join(DagRun, DagRun.id == link.dag_run_id)
        event_ids, consumed = sorted({find[2] for find in found}), set()
        for start in range(0, len(event_ids), 500):
            consumed.update(
                session.execute(links.where(link.event_id.in_(event_ids[start : start + 500]))).all()
            )
        took = time.monotonic() - started
        if len(events) == size and took < 0.001:
            net.probe_size = min(1_000, size * 2)
        elif took > 0.002:
            net.probe_size = max(5, size // 2)
        return [find for find in found if (find[2], find[0]) not in consumed]

    @staticmethod
    def _both_ends(items: list[Any], size: int) -> tuple[list[Any], list[Any]]:
        """``size`` of ``items``, half from each end, and the rest in order."""
        first = (size + 1) // 2
        last = min(size // 2, max(0, len(items) - first))
        return items[:first] + items[len(items) - last :], items[first : len(items) - last]

    def _dataset_consumers(
        self, datasets: list[int], session: Session
    ) -> dict[int, list[tuple[str, Any, Any]]]:
        """
        Per dataset of ``datasets``, its consumers with a dataset-triggered run, paused or inactive too (a
        finding waits): (dag_id, top, oldest run's date). Below ``top`` (the latest run's date, or higher what
        this process remembers of its read) an event is below where the DAG's next read starts; below the
        oldest run, a ``db clean`` may have deleted the run that consumed it.
        """
        consumers_of: dict[int, list[tuple[str, Any, Any]]] = defaultdict(list)
        if not datasets:  # (an idle look builds no statement)
            return consumers_of
        reference = DagScheduleDatasetReference
        latest_run, oldest_run = (
            self._latest_dataset_run_date(reference.dag_id, oldest) for oldest in (False, True)
        )
        consumers = select(reference.dag_id, reference.dataset_id, latest_run, oldest_run)
        checked = self.__dict__.get("_dataset_race_fix_checked", {})  # of _DatasetCheckedRead
        for start in range(0, len(datasets), 500):
            for dag_id, dataset_id, latest, oldest in session.execute(
                consumers.where(reference.dataset_id.in_(datasets[start : start + 500]))
            ):
                read = checked.get((dag_id, dataset_id))
                if latest is not None:
                    consumers_of[dataset_id].append(
                        (dag_id, max(latest, read.floor) if read else latest, oldest)
                    )
        return consumers_of

    def _dataset_follow_mark(self, net: _DatasetNet, session: Session) -> dict[str, Any] | None:
        """
        Where the ids were followed, for the next process (a restart, a scheduler taking over; BUG_REPORT,
        "The net"): a ``log`` row, ``event`` "dataset-race-fix-followed", ``extra`` the highest id seen (below
        the late events not probed yet) and the ids missing below it. A new process reads the newest mark
        (None: none); then writes its own where it moved, at most every 5 s, on a connection of its own.
        """
        import json

        manager = self._dataset_manager()
        mark = "dataset-race-fix-followed"  # one row a process, updated in place: as many as scheduler starts
        if net.high is None:  # the newest mark, however old: its process started from the marks before it
            newest = select(Log.dttm, Log.extra).where(Log.event == mark).order_by(Log.dttm.desc()).limit(1)
            for dttm, extra in session.execute(newest):
                age = (manager._database_now(session) - dttm).total_seconds()
                return {**json.loads(extra), "age": max(0.0, age)}
            return None
        # late events not probed yet are read again from the lowest of them by the next process
        high = min([net.high, *(event[0] - 1 for event in net.late + net.below)])
        missing = sorted(i for i in net.missing if i <= high)
        interval = manager._dataset_race_fix_setting("net_look_interval_seconds")
        if (high, missing) == net.marked or (interval and time.monotonic() - net.marked_at < 5):
            return None
        extra = json.dumps({"high": high, "missing": missing})
        row = {"dttm": manager._database_now(session), "event": mark, "extra": extra}
        with session.get_bind().engine.begin() as connection:
            # PostgreSQL: no wait for the WAL flush (0.5 ms, not 3-10). A server crash may lose this write
            # alone (the findings before it committed, flushed): the next process reads on from an older mark
            if connection.dialect.name == "postgresql":
                connection.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")
            if net.mark_id is not None:
                connection.execute(Log.__table__.update().where(Log.id == net.mark_id).values(row))
            else:
                net.mark_id = connection.execute(Log.__table__.insert().values(row)).inserted_primary_key[0]
        net.marked, net.marked_at = (high, missing), time.monotonic()
        return None

    @staticmethod
    def _latest_dataset_run_date(dag_id: Any, oldest: bool = False) -> Any:
        """
        The date of the latest (``oldest``) dataset-triggered run of the correlated ``dag_id``: the newest
        (oldest) run's if dataset-triggered, else searched; LIMIT 1: max() read every run on MySQL (The floor)
        """
        from sqlalchemy import case

        order = DagRun.execution_date.asc() if oldest else DagRun.execution_date.desc()
        first = select(case((DagRun.run_type == DagRunType.DATASET_TRIGGERED, DagRun.execution_date)))
        first_if_dataset_triggered = (
            first.where(DagRun.dag_id == dag_id).order_by(order).limit(1).scalar_subquery()
        )
        searched = select(DagRun.execution_date).where(DagRun.dag_id == dag_id)
        searched = searched.where(DagRun.run_type == DagRunType.DATASET_TRIGGERED).order_by(order).limit(1)
        return func.coalesce(first_if_dataset_triggered, searched.scalar_subquery())

    def _decide_dataset_triggered_runs(
        self,
        dag_models: Collection[DagModel],
        dataset_triggered_dag_info: dict[str, tuple[datetime, datetime]],
        session: Session,
    ) -> tuple[list[_DatasetDecision], list[tuple[int, str, Any]]]:
        """
        The runs this loop creates for these DAGs, a decision per DAG in dag_id order, and the queue rows it
        then deletes (as read); writes nothing (explain runs it).
        """
        from airflow.timetables.base import DataInterval

        manager = self._dataset_manager()
        dialect = session.bind.dialect.name
        state = self._read_dataset_decision_state(sorted(dm.dag_id for dm in dag_models), session)
        lookback = timedelta(seconds=manager._dataset_race_fix_setting("event_lookback_seconds"))
        commit_latency = timedelta(seconds=manager._dataset_race_fix_setting("commit_latency_seconds"))
        # The net's findings: a decision reads from their stamps, and they go with the run that consumes them.
        findings = getattr(self.__dict__.get("_dataset_race_fix_net"), "findings", None) or {}
        # Nothing dated further ahead of the database's clock (a stock producer's host clock) dates a run.
        horizon = state.database_now + timedelta(
            seconds=manager._dataset_race_fix_setting("max_event_ahead_seconds")
        )
        consumed_rows: list[tuple[int, str, Any]] = []  # deleted at the end, as read
        decisions: list[SchedulerJobRunner._DatasetDecision] = []
        for dag_model in sorted(dag_models, key=lambda dm: dm.dag_id):
            decision = self._DatasetDecision(dag_model.dag_id)
            decisions.append(decision)
            dag = self.dagbag.get_dag(dag_model.dag_id, session=session)
            if not dag:
                self.log.error("DAG '%s' not found in serialized_dag table", dag_model.dag_id)
                decision.skipped = "not found in the serialized_dag table"
                continue
            if not isinstance(dag.timetable, DatasetTriggeredTimetable):
                self.log.error(
                    "DAG '%s' was dataset-scheduled, but didn't have a DatasetTriggeredTimetable!",
                    dag_model.dag_id,
                )
                decision.skipped = "not dataset-scheduled (no DatasetTriggeredTimetable)"
                continue
            queued = state.queued_rows.get(dag.dag_id, {})
            latest_run_date, latest_interval_end, latest_any_run_date, oldest_run_date = (
                state.latest_runs.get(dag.dag_id, (None,) * 4)
            )
            dataset_ids = sorted(state.dataset_ids_of[dag.dag_id])
            found = findings.get(dag.dag_id, {})
            found_late = {
                dataset_id: stamp for dataset_id, (stamp, _) in found.items() if latest_run_date is not None
            }
            # the clock behind the latest run (stepped back): read from the run before it, as stock
            below_clock = None
            if latest_run_date is not None and latest_run_date > state.database_now:
                runs = select(DagRun.execution_date).where(DagRun.dag_id == dag.dag_id)
                runs = runs.where(DagRun.run_type == DagRunType.DATASET_TRIGGERED)
                runs = runs.where(DagRun.execution_date <= state.database_now)
                below_clock = session.scalar(runs.order_by(DagRun.execution_date.desc()).limit(1))
            floors = self._dataset_floors(
                dataset_ids,
                latest_run_date,
                state.database_now,
                queued,
                state.newest_consumed.get(dag.dag_id, {}),
                found_late,
                lookback,
                commit_latency,
                self._checked_dataset_floors(dag.dag_id, dataset_ids, state.database_now, latest_run_date),
                below_clock,
                oldest_run_date,
            )
            dataset_events = []  # those no run of the DAG consumed, from their floors on, per 500 datasets
            for start in range(0, len(dataset_ids), 500):
                chunk, by_floor = dataset_ids[start : start + 500], defaultdict(list)
                for dataset_id in chunk if floors.runs_floor is not None else ():
                    by_floor[floors.floors[dataset_id]].append(dataset_id)
                groups = len(by_floor)  # 0: a first run, every event
                chosen = self._dataset_statement(
                    ("events", dialect, groups), lambda: self._events_not_consumed_statement(dialect, groups)
                )
                params = (
                    {"dag_id": dag.dag_id, "runs_floor": floors.runs_floor} if groups else {"ids_0": chunk}
                )
                for i, (floor, ids) in enumerate(sorted(by_floor.items())):
                    params.update({f"ids_{i}": ids, f"floor_{i}": floor})
                # On the connection: the ORM's result layer doubled the time of 200 000 rows.
                dataset_events += [
                    self._DatasetEventRead(*row) for row in session.connection().execute(chosen, params)
                ]
            self._remember_dataset_reads(dag.dag_id, floors, dataset_events, state, commit_latency)
            choice = self._choose_dataset_run(
                dataset_events,
                horizon,
                latest_run_date,
                dataset_triggered_dag_info[dag.dag_id][1],
                queued,
                state.dataset_uris,
                lambda statuses: dag.timetable.dataset_condition.evaluate(statuses),
            )
            decision.dag, decision.choice = dag, choice
            if choice.old_serialization:  # as in DagModel.dags_needing_dagruns
                self.log.warning("dag '%s' has old serialization; skipping DAG run creation.", dag.dag_id)
                decision.skipped = "serialized before Airflow 2.9"
                continue
            consumed_rows += [
                (d, dag.dag_id, state.stored_as_read[(d, dag.dag_id)]) for d in choice.rows_done
            ]
            # a finding goes with the run, or once its dataset has nothing left to consume (taken elsewhere)
            with_events = {event.dataset_id for event in choice.events}
            decision.findings_done = [
                (dataset_id, row_ids)
                for dataset_id, (_, row_ids) in found.items()
                if choice.execution_date is not None or dataset_id not in with_events
            ]
            if choice.execution_date is None:
                continue
            events = self._events_for_timetable(dag.timetable, choice.events, session)
            exec_date = choice.execution_date
            # Explicitly check if a DagRun already exists at this date (a manual run, say): move past it.
            if latest_any_run_date and exec_date <= latest_any_run_date:
                while session.scalar(
                    select(func.count(DagRun.id)).where(
                        DagRun.dag_id == dag.dag_id, DagRun.execution_date == exec_date
                    )
                ):
                    exec_date += timedelta(microseconds=1)
            exec_date = timezone.coerce_datetime(exec_date)
            data_interval = dag.timetable.data_interval_for_events(exec_date, events)
            if latest_interval_end and data_interval.start < latest_interval_end:  # not overlapping the last
                start = timezone.coerce_datetime(latest_interval_end)
                data_interval = DataInterval(start, max(data_interval.end, start))
            decision.run_id = dag.timetable.generate_run_id(
                run_type=DagRunType.DATASET_TRIGGERED,
                logical_date=exec_date,
                data_interval=data_interval,
                session=session,
                events=events,
            )
            decision.execution_date, decision.data_interval = exec_date, data_interval
        return decisions, consumed_rows

    def _dataset_statement(self, key: tuple[Any, ...], build: Callable[[], Any]) -> Any:
        """The statement kept under ``key``, built by ``build()`` once a process (BUG_REPORT 7: loop cost)."""
        statements: dict[tuple[Any, ...], Any] = self.__dict__.setdefault("_dataset_race_fix_statements", {})
        if key not in statements:
            statements[key] = build()
        return statements[key]

    def _read_dataset_decision_state(self, dag_ids: list[str], session: Session) -> _DatasetDecisionState:
        """The state the decisions of ``dag_ids`` start from, read lock-free, two statements per 500 DAGs."""
        from sqlalchemy import Text, bindparam, cast

        dialect = session.bind.dialect.name
        clock = self._dataset_manager()._database_clock(dialect)
        queue = DatasetDagRunQueue
        as_stored = cast(queue.created_at, Text) if dialect == "sqlite" else queue.created_at
        queue_rows_of_dags = self._dataset_statement(
            ("queue rows", dialect),
            lambda: select(
                queue.dataset_id, queue.target_dag_id, queue.created_at, as_stored.label("stored")
            ).where(queue.target_dag_id.in_(bindparam("dag_ids", expanding=True))),
        )
        runs_and_datasets_of_dags = self._dataset_statement(
            ("runs and datasets", dialect, clock), lambda: self._runs_and_datasets_statement(dialect, clock)
        )
        state = self._DatasetDecisionState(
            defaultdict(dict), {}, defaultdict(set), {}, defaultdict(dict), {}, None
        )
        for start in range(0, len(dag_ids), 500):
            chunk = dag_ids[start : start + 500]
            for dataset_id, dag_id, created_at, stored in session.execute(
                queue_rows_of_dags, {"dag_ids": chunk}
            ):
                state.queued_rows[dag_id][dataset_id] = created_at
                state.stored_as_read[(dataset_id, dag_id)] = stored
            runs_and_datasets = session.execute(runs_and_datasets_of_dags, {"dag_ids": chunk})
            for dag_id, *dates, now, dataset_id, uri, newest in runs_and_datasets:
                state.latest_runs[dag_id] = tuple(dates)
                state.database_now = state.database_now or now
                if dataset_id is not None:
                    state.dataset_ids_of[dag_id].add(dataset_id)
                    state.dataset_uris[dataset_id] = uri
                if newest is not None:
                    state.newest_consumed[dag_id][dataset_id] = newest
        for dag_id, queued in state.queued_rows.items():  # an alias resolved before its DAG was parsed again
            state.dataset_ids_of[dag_id].update(queued)
        unknown = sorted(set().union(*state.queued_rows.values()) - state.dataset_uris.keys())
        for start in range(0, len(unknown), 500):
            uris = select(DatasetModel.id, DatasetModel.uri).where(
                DatasetModel.id.in_(unknown[start : start + 500])
            )
            state.dataset_uris.update(session.execute(uris))
        state.database_now = state.database_now or self._dataset_manager()._database_now(session)
        return state

    @classmethod
    def _runs_and_datasets_statement(cls, dialect: str, clock: str | None) -> Any:
        """
        Per DAG of ``dag_ids``, a row per dataset it is scheduled on (or one without): its latest runs, the
        database's clock, the dataset's id, URI and newest event the latest run consumed, found at once, any
        statistics ("The floor": the run's links newest first, LATERAL on PostgreSQL, STRAIGHT_JOIN on MySQL).
        """
        from airflow.models.dataset import association_table
        from airflow.utils.sqlalchemy import UtcDateTime
        from sqlalchemy import bindparam, case, literal_column, null, true

        reference = DagScheduleDatasetReference
        clock_column = literal_column(clock, UtcDateTime) if clock else null()  # SQLite: this host's clock
        if dialect == "postgresql":
            # The DAG's newest run of any type, then, only if it is not dataset-triggered, the newest one
            columns = DagRun.id, DagRun.execution_date, DagRun.data_interval_end
            newest = select(*columns, DagRun.run_type).where(DagRun.dag_id == DagModel.dag_id)
            newest = newest.order_by(DagRun.execution_date.desc()).limit(1).correlate(DagModel).lateral()
            searched = select(*columns).where(newest.c.run_type != DagRunType.DATASET_TRIGGERED)
            searched = searched.where(
                DagRun.dag_id == DagModel.dag_id, DagRun.run_type == DagRunType.DATASET_TRIGGERED
            )
            searched = (
                searched.order_by(DagRun.execution_date.desc()).limit(1).correlate(DagModel, newest).lateral()
            )
            newest_is_it = newest.c.run_type == DagRunType.DATASET_TRIGGERED
            latest_id, latest_date, latest_interval_end = (
                case((newest_is_it, getattr(newest.c, name)), else_=getattr(searched.c, name))
                for name in ("id", "execution_date", "data_interval_end")
            )
            event_of_link = select(DatasetEvent.timestamp).where(
                DatasetEvent.id == association_table.c.event_id
            )
            # LATERAL (OFFSET 0: not pulled up into a join): the link beside it, the reference two levels up
            event_of_link = event_of_link.where(DatasetEvent.dataset_id == reference.dataset_id).offset(0)
            event_of_link = event_of_link.correlate(association_table, reference).lateral()
            consumed = select(event_of_link.c.timestamp).select_from(
                association_table.join(event_of_link, true())
            )
            consumed = consumed.where(association_table.c.dag_run_id == latest_id)
            consumed = consumed.order_by(association_table.c.event_id.desc())
            newest_consumed_by_latest_run = (
                consumed.limit(1).correlate(reference, newest, searched).scalar_subquery()
            )
            any_run_latest = newest.c.execution_date  # any run's latest (execution_date is never NULL)
        else:

            def latest_run_of(column: Any) -> Any:
                latest = select(column).where(
                    DagRun.dag_id == DagModel.dag_id, DagRun.run_type == dataset_triggered
                )
                latest = latest.order_by(DagRun.execution_date.desc()).limit(1)
                return latest.correlate(DagModel).scalar_subquery()  # explicit: two levels down it is not

            dataset_triggered = DagRunType.DATASET_TRIGGERED
            latest_date = latest_run_of(DagRun.execution_date)
            latest_interval_end = latest_run_of(DagRun.data_interval_end)
            any_run_latest = select(func.max(DagRun.execution_date)).where(DagRun.dag_id == DagModel.dag_id)
            any_run_latest = any_run_latest.scalar_subquery()
            link_to_event = association_table.join(
                DatasetEvent, DatasetEvent.id == association_table.c.event_id
            )
            consumed = select(DatasetEvent.timestamp).prefix_with("STRAIGHT_JOIN", dialect="mysql")
            consumed = consumed.select_from(link_to_event).where(
                DatasetEvent.dataset_id == reference.dataset_id
            )
            consumed = consumed.where(association_table.c.dag_run_id == latest_run_of(DagRun.id))
            consumed = consumed.order_by(association_table.c.event_id.desc())
            newest_consumed_by_latest_run = consumed.limit(1).scalar_subquery()
        oldest = cls._latest_dataset_run_date(DagModel.dag_id, oldest=True)
        statement = select(
            DagModel.dag_id,
            latest_date,
            latest_interval_end,
            any_run_latest,
            oldest,
            clock_column,
            DatasetModel.id,
            DatasetModel.uri,
            newest_consumed_by_latest_run,
        )
        if dialect == "postgresql":
            statement = statement.select_from(DagModel).outerjoin(newest, true()).outerjoin(searched, true())
        return (
            statement.outerjoin(reference, reference.dag_id == DagModel.dag_id)
            .outerjoin(DatasetModel, DatasetModel.id == reference.dataset_id)
            .where(DagModel.dag_id.in_(bindparam("dag_ids", expanding=True)))
        )

    @staticmethod
    def _events_not_consumed_statement(dialect: str, groups: int) -> Any:
        """
        Events of datasets ``ids_<i>`` from ``floor_<i>`` on (``i < groups``) that no run of ``dag_id`` from
        ``runs_floor`` on consumed (BUG_REPORT section 4, step 2); ``groups`` 0: all of ``ids_0`` (first run).
        """
        from airflow.models.dataset import association_table
        from sqlalchemy import bindparam, true

        names = ("id", "dataset_id", "timestamp", "source_dag_id", "source_run_id")  # _DatasetEventRead's
        columns = [getattr(DatasetEvent, name) for name in names]
        if not groups:
            return select(*columns).where(DatasetEvent.dataset_id.in_(bindparam("ids_0", expanding=True)))
        runs_from_floor = (
            DagRun.dag_id == bindparam("dag_id"),
            DagRun.execution_date >= bindparam("runs_floor"),
        )
        consumed = select(association_table.c.event_id).join(
            DagRun, DagRun.id == association_table.c.dag_run_id
        )
        consumed = consumed.where(*runs_from_floor)
        if dialect == "postgresql":
            # One index probe per run: LATERAL (OFFSET 0: not pulled up into a join), no hash of all links
            runs = select(DagRun.id).where(*runs_from_floor).subquery()
            links = select(association_table.c.event_id).where(association_table.c.dag_run_id == runs.c.id)
            links = links.offset(0).lateral()
            consumed = select(links.c.event_id).select_from(runs.join(links, true()))
        in_groups = (
            DatasetEvent.dataset_id.in_(bindparam(f"ids_{i}", expanding=True)) for i in range(groups)
        )
        from_floors = (
            and_(ids, DatasetEvent.timestamp >= bindparam(f"floor_{i}")) for i, ids in enumerate(in_groups)
        )
        chosen = select(*columns).where(or_(*from_floors), DatasetEvent.id.not_in(consumed))
        if dialect == "mysql":
            # InnoDB's secondary indexes carry the primary key: the check runs on the index, reads kept rows
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
        Where a DAG reads each dataset's events from (BUG_REPORT, "The floor"); pure. ``found_late``: the
        net's oldest late commit; ``checked``: where this process's last read left nothing (remembered reads).
        """
        if latest_run_date is None:  # no run of this DAG has consumed anything yet
            return cls._DatasetFloors({}, None, True)
        # a clock stepped back: read from the run at or before it, as stock
        full_read = latest_run_date > database_now
        full_from = (below_clock or database_now) if full_read else latest_run_date
        full_floor = min([full_from, database_now, *queued.values()]) - lookback
        # db clean's runs lay below the oldest: only the latency below the newest consumed event (a late
        # commit just below a first run), a queue row written before it, or a late commit the net found read
        # there (a clock behind every run reads below them all: what it stamps lies there)
        kept_from = full_floor if full_read or oldest_run_date is None else max(full_floor, oldest_run_date)
        checked = checked or {}
        floors: dict[int, datetime] = {}
        for dataset_id in dataset_ids:
            newest = newest_consumed.get(dataset_id)
            if full_read or newest is None:
                floor = kept_from
            else:  # what this process checked raises it, never above a queue row's
                floor = max(newest - commit_latency, checked.get(dataset_id, full_floor), full_floor)
            # a row written after the oldest run brings no event from below it (db clean's)
            if dataset_id in queued:
                row = queued[dataset_id]
                floor = min(
                    floor, max(row - commit_latency, kept_from if row > kept_from else row - commit_latency)
                )
            floors[dataset_id] = max(floor, full_floor)
            if dataset_id in found_late:  # the net's finding, however old: never below db clean's runs
                floors[dataset_id] = min(
                    floors[dataset_id], max(found_late[dataset_id], oldest_run_date or kept_from)
                )
        return cls._DatasetFloors(floors, min(floors.values(), default=full_floor), full_read)

    def _remember_dataset_reads(
        self,
        dag_id: str,
        floors: _DatasetFloors,
        events: list[Any],
        state: _DatasetDecisionState,
        latency: timedelta,
    ) -> None:
        """
        Per dataset read, below what nothing unconsumed can appear after the read (BUG_REPORT, "The floor",
        what a process remembers): the lowest event left, or the clock read before it less ``latency``.
        """
        if floors.runs_floor is None:  # a first run: every event was read, nothing is left behind it
            return
        checked = self.__dict__.setdefault("_dataset_race_fix_checked", {})  # of _DatasetCheckedRead
        if len(checked) > 100_000:  # DAGs come and go: forgetting only makes a read start lower
            checked.clear()
        lowest_left: dict[int, datetime] = {}
        for event in events:  # deferred, late and waiting ones alike: still unconsumed
            lowest = lowest_left.get(event.dataset_id, event.timestamp)
            lowest_left[event.dataset_id] = min(event.timestamp, lowest)
        read_at, run_date = state.database_now, state.latest_runs[dag_id][0]
        below = read_at - latency
        for dataset_id in floors.floors:
            floor = min(lowest_left.get(dataset_id, below), below)
            checked[(dag_id, dataset_id)] = self._DatasetCheckedRead(read_at, run_date, floor)

    def _checked_dataset_floors(
        self, dag_id: str, dataset_ids: list[int], database_now: datetime, latest_run_date: datetime | None
    ) -> dict[int, datetime]:
        """What ``_remember_dataset_reads`` kept, unless the clock went back or the latest run is older."""
        checked = self.__dict__.get("_dataset_race_fix_checked", {})
        floors = {}
        for dataset_id in dataset_ids:
            read = checked.get((dag_id, dataset_id))
            if read and latest_run_date and read.read_at <= database_now and read.run_date <= latest_run_date:
                floors[dataset_id] = read.floor
        return floors

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
        Whether a DAG's events make a run, and its date before the unique-date check; pure (BUG_REPORT section
        4, steps 3-4). Events beyond the horizon wait; no run: queue rows of datasets with nothing to take go.
        """
        deferred = [event for event in dataset_events if event.timestamp > horizon]
        events = [event for event in dataset_events if event.timestamp <= horizon]
        late = [event for event in events if latest_run_date and event.timestamp <= latest_run_date]
        with_events = {event.dataset_id for event in events}
        statuses = {
            dataset_uris[dataset_id]: True for dataset_id in with_events if dataset_id in dataset_uris
        }
        try:
            ready = bool(events) and evaluate(statuses)
        except AttributeError:  # serialized before 2.9
            return cls._DatasetRunChoice(events, deferred, late, None, (), old_serialization=True)
        if not ready:
            return cls._DatasetRunChoice(
                events, deferred, late, None, tuple(d for d in queued if d not in with_events)
            )
        queue_dates = (timezone.coerce_datetime(loop_date), *queued.values())
        execution_date = max(
            [
                *(created_at for created_at in queue_dates if created_at <= horizon),
                *(e.timestamp for e in events),
            ]
        )
        if latest_run_date:
            execution_date = max(execution_date, latest_run_date + timedelta(microseconds=1))
        return cls._DatasetRunChoice(events, deferred, late, execution_date, tuple(queued))

    @classmethod
    def _events_for_timetable(cls, timetable: Any, events: list[Any], session: Session) -> list[Any]:
        """
        ``events`` as ``timetable`` reads them, each ``source_dag_run`` read a statement per 500 producer
        runs, not lazily; a timetable overriding them (not DatasetOrTimeSchedule's run_id): stock.
        """
        from airflow.timetables.datasets import DatasetOrTimeSchedule

        kind, own = type(timetable), DatasetTriggeredTimetable
        if kind.data_interval_for_events is not own.data_interval_for_events or kind.generate_run_id not in (
            own.generate_run_id,
            DatasetOrTimeSchedule.generate_run_id,
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
                chunk = select(*columns).where(
                    DagRun.dag_id == dag_id, DagRun.run_id.in_(run_ids[start : start + 500])
                )
                runs.update(((dag_id, run.run_id), run) for run in session.execute(chunk))
        for event in events:
            event.source_dag_run = runs.get((event.source_dag_id, event.source_run_id))
        return events

    @staticmethod
    def _dataset_events_by_id(event_ids: list[int], session: Session) -> list[DatasetEvent]:
        """Airflow's objects of the events ``event_ids``, in order, but those deleted since (500 a query)."""
        by_id: dict[int, DatasetEvent] = {}
        for start in range(0, len(event_ids), 500):
            chunk = select(DatasetEvent).where(DatasetEvent.id.in_(event_ids[start : start + 500]))
            by_id.update((event.id, event) for event in session.scalars(chunk))
        return [by_id[event_id] for event_id in event_ids if event_id in by_id]

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
            if decision.skipped:
                continue
            dag, choice = decision.dag, decision.choice
            if choice.deferred:
                Stats.incr("dataset_race_fix.future_events_deferred", len(choice.deferred))
                warned = self.__dict__.setdefault("_dataset_race_fix_warned_ahead", set())
                if dag.dag_id not in warned:
                    warned.add(dag.dag_id)
                    self.log.warning(
                        "DAG '%s': %d dataset event(s) dated up to %s, ahead of the scheduler's clock by "
                        "more than [dataset_race_fix] max_event_ahead_seconds (a producer host's clock runs "
                        "ahead): they wait",
                        dag.dag_id,
                        len(choice.deferred),
                        max(event.timestamp for event in choice.deferred),
                    )
            dag_hash = self.dagbag.dags_hash.get(dag.dag_id)
            exec_date = decision.execution_date
            data_interval, run_id = decision.data_interval, decision.run_id
            if exec_date is None:
                Stats.incr("dataset_race_fix.empty_runs_prevented")
            else:
                if choice.late:
                    Stats.incr("dataset_race_fix.late_events_consumed", len(choice.late))
                    self.log.info(
                        "DAG '%s': the new run consumes %d event(s) dated before its latest run: late "
                        "commits, or events of a deleted run (deleting a run gives its events back)",
                        dag.dag_id,
                        len(choice.late),
                    )
                dag_run = dag.create_dagrun(
                    run_id=run_id,
                    run_type=DagRunType.DATASET_TRIGGERED,
                    execution_date=exec_date,
                    data_interval=data_interval,
                    state=DagRunState.QUEUED,
                    external_trigger=False,
                    session=session,
                    dag_hash=dag_hash,
                    creating_job_id=self.job.id,
                )
                Stats.incr("dataset.triggered_dagruns")
                self._link_consumed_events(dag_run.id, [event.id for event in choice.events], session)
        if consumed_rows:
            self._delete_dataset_queue_rows_as_read(consumed_rows, session)
        # the net's findings these decisions consumed or found consumed, as read (by key, in this transaction)
        net_findings = getattr(self.__dict__.get("_dataset_race_fix_net"), "findings", None) or {}
        done: list[int] = []
        for decision in decisions:
            for dataset_id, row_ids in decision.findings_done or ():
                done += row_ids
                net_findings.get(decision.dag_id, {}).pop(dataset_id, None)
        for start in range(0, len(done), 500):
            chunk = sorted(done)[start : start + 500]
            session.execute(delete(Log).where(Log.id.in_(chunk)).execution_options(synchronize_session=False))

    @staticmethod
    def _link_consumed_events(dag_run_id: int, event_ids: list[int], session: Session) -> None:
        """Link a run to its events, 10 000 integers a statement (BUG_REPORT, "Statement size")."""
        insert = "INSERT INTO dagrun_dataset_event (dag_run_id, event_id) VALUES "
        for start in range(0, len(event_ids), 10_000):
            rows = ",".join(
                f"({int(dag_run_id)},{int(event_id)})" for event_id in event_ids[start : start + 10_000]
            )
            session.connection().exec_driver_sql(insert + rows)

    @staticmethod
    def _delete_dataset_queue_rows_as_read(rows: list[tuple[int, str, Any]], session: Session) -> None:
        """Delete the queue rows ``(dataset_id, target_dag_id, created_at)`` as read ("Lock discipline")."""
        from sqlalchemy import Text, any_, bindparam, cast, literal_column, tuple_

        rows = sorted(rows)
        dialect = session.bind.dialect
        if dialect.name == "sqlite":  # one writer at a time, no row locks; executemany, no statement limit
            as_read = (
                DatasetDagRunQueue.dataset_id == bindparam("b_dataset_id"),
                DatasetDagRunQueue.target_dag_id == bindparam("b_target_dag_id"),
                cast(DatasetDagRunQueue.created_at, Text) == bindparam("b_stored", type_=Text),
            )
            session.execute(
                delete(DatasetDagRunQueue).where(*as_read).execution_options(synchronize_session=False),
                [{"b_dataset_id": d, "b_target_dag_id": t, "b_stored": s} for d, t, s in rows],
            )
            return
        key_columns = (DatasetDagRunQueue.dataset_id, DatasetDagRunQueue.target_dag_id)
        as_read = tuple_(*key_columns, DatasetDagRunQueue.created_at)
        for start in range(0, len(rows), 500):
            chunk = rows[start : start + 500]
            if dialect.name == "postgresql":
                # The rows as read but those a producer holds, deleted by address; ARRAY(..): locked once.
                ctid = literal_column("ctid")
                taken = select(ctid).select_from(DatasetDagRunQueue.__table__).where(as_read.in_(chunk))
                session.execute(
                    delete(DatasetDagRunQueue)
                    .where(
                        ctid == any_(func.array(taken.with_for_update(skip_locked=True).scalar_subquery()))
                    )
                    .execution_options(synchronize_session=False)
                )
                continue
            # MySQL/MariaDB: lock by primary key, skipping what producers hold where the server can (else
            # waiting in key order, as producers do), then delete exactly those keys, by primary key.

            version = dialect.server_version_info or ()
            taken = session.execute(
                select(*key_columns)
                .with_hint(DatasetDagRunQueue.__table__, "FORCE INDEX (PRIMARY)")
                .where(as_read.in_(chunk))
                .with_for_update(skip_locked=version >= ((10, 6) if dialect.is_mariadb else (8, 0, 1)))
            ).all()
            if taken:
                from airflow.datasets.manager import DatasetManager

                keys_first, params = DatasetManager._queue_keys_joined_first([tuple(row) for row in taken])
                DatasetManager._send(session, f"DELETE q FROM {keys_first}", params)
