"""Edges of the fixed run creation that the race scenarios do not reach."""

from __future__ import annotations

from datetime import timedelta

from airflow.datasets import DatasetAll
from airflow.models.dag import DagModel
from airflow.models.dagrun import DagRun
from airflow.models.dataset import DatasetDagRunQueue, DatasetEvent, DatasetModel
from airflow.utils.session import create_session
from airflow.utils.state import DagRunState
from airflow.utils.types import DagRunType
from sqlalchemy import select

from reproduce.harness.world import World


def _runs(dag_id: str):
    with create_session() as session:
        return [
            (run.run_type, run.execution_date, len(run.consumed_dataset_events))
            for run in session.scalars(select(DagRun).where(DagRun.dag_id == dag_id).order_by(DagRun.id))
        ]


def _queued(dag_id: str) -> int:
    with create_session() as session:
        return len(
            session.scalars(
                select(DatasetDagRunQueue).where(DatasetDagRunQueue.target_dag_id == dag_id)
            ).all()
        )


def test_a_manual_run_at_the_same_date_is_stepped_over(variant_fixed):
    w = World("manual_same_date")
    try:
        a = w.dataset("a")
        dag_id = w.consumer("d", [a])
        p, s = w.producer("P"), w.scheduler()
        w.clock.at(1)
        w.emit(p, a), p.finish()
        with create_session() as session:
            # the event's commit stamp, on the database's clock: the date its run would get
            at = session.scalar(
                select(DatasetEvent.timestamp)
                .join(DatasetModel, DatasetModel.id == DatasetEvent.dataset_id)
                .where(DatasetModel.uri == a.uri)
            )
            dag = session.scalar(select(DagModel).where(DagModel.dag_id == dag_id))
            from airflow.models.serialized_dag import SerializedDagModel

            SerializedDagModel.get_dag(dag.dag_id, session=session).create_dagrun(
                run_id="manual__same_date",
                run_type=DagRunType.MANUAL,
                execution_date=at,
                state=DagRunState.SUCCESS,
                external_trigger=True,
                session=session,
            )
        w.clock.at(2), w.loop(s), s.finish()
        runs = _runs(dag_id)
        assert runs[1] == (DagRunType.DATASET_TRIGGERED, at + timedelta(microseconds=1), 1)
        assert _queued(dag_id) == 0
        assert w.report().violations() == {}
    finally:
        w.close()


def test_a_manual_run_after_the_latest_dataset_run_leaves_its_floor_as_it_was(variant_fixed):
    """
    The latest dataset-triggered run is the DAG's newest run, or, when a manual run is newer, searched for
    (PostgreSQL reads the newest run by index order and searches only then): either way the next run consumes
    the new event only, never the one the dataset-triggered run consumed.
    """
    w = World("manual_after")
    try:
        a = w.dataset("a")
        dag_id = w.consumer("d", [a])
        p, s = w.producer("P"), w.scheduler()
        w.clock.at(1), w.emit(p, a), p.finish()
        w.clock.at(2), w.loop(s), s.finish()  # run 1 consumes the first event
        with create_session() as session:
            from airflow.models.serialized_dag import SerializedDagModel

            newest = session.scalar(select(DagRun.execution_date).where(DagRun.dag_id == dag_id))
            SerializedDagModel.get_dag(dag_id, session=session).create_dagrun(
                run_id="manual__after",
                run_type=DagRunType.MANUAL,
                execution_date=newest + timedelta(seconds=1),
                state=DagRunState.SUCCESS,
                external_trigger=True,
                session=session,
            )
        w.clock.at(3), w.emit(p, a), p.finish()
        w.clock.at(4), w.loop(s), s.finish()
        runs = _runs(dag_id)
        assert [(run_type, consumed) for run_type, _, consumed in runs] == [
            (DagRunType.DATASET_TRIGGERED, 1),
            (DagRunType.MANUAL, 0),
            (DagRunType.DATASET_TRIGGERED, 1),
        ], runs
        assert w.report().violations() == {}
    finally:
        w.close()


def test_and_condition_is_judged_on_events_not_on_stale_queue_rows(variant_fixed):
    w = World("and_stale_row")
    try:
        a, b = w.dataset("a"), w.dataset("b")
        dag_id = w.consumer("d", DatasetAll(a, b))
        p, s = w.producer("P"), w.scheduler()
        w.clock.at(1), w.emit(p, a), p.finish()
        w.clock.at(2), w.emit(p, b), p.finish()
        w.clock.at(3), w.loop(s), s.finish()  # run 1 takes both events
        # A queue row for `a` whose events run 1 already took (left by S4, or by a stock
        # producer during a rolling restart), then a new event on `b` only.
        with create_session() as session:
            a_id = session.scalar(select(DatasetModel.id).where(DatasetModel.uri == a.uri))
            session.add(DatasetDagRunQueue(dataset_id=a_id, target_dag_id=dag_id, created_at=w.clock.at(3.5)))
        w.clock.at(4), w.emit(p, b), p.finish()
        w.clock.at(5), w.loop(s), s.finish()
        assert [r[2] for r in _runs(dag_id)] == [2]  # a & b is not met by events: no run
        assert _queued(dag_id) == 1  # the stale row of a is gone, b's row waits
        w.clock.at(6), w.emit(p, a), p.finish()
        w.clock.at(7), w.loop(s), s.finish()
        assert [r[2] for r in _runs(dag_id)] == [2, 2]
        assert _queued(dag_id) == 0
        assert w.report().violations() == {}
    finally:
        w.close()


def test_a_timetable_that_reads_events_its_own_way_gets_airflows_objects(variant_fixed):
    """
    Run creation reads events as columns (issue 49). A timetable that overrides Airflow's
    ``data_interval_for_events`` gets Airflow's DatasetEvent objects, in the decision's order; Airflow's own
    and DatasetOrTimeSchedule (whose run_id takes no event) get the columns, each with its producer run set.
    """
    from airflow.timetables.datasets import DatasetOrTimeSchedule
    from airflow.timetables.simple import DatasetTriggeredTimetable
    from airflow.timetables.trigger import CronTriggerTimetable

    from airflow_dataset_race_fix.fix.jobs.scheduler_job_runner import SchedulerJobRunner as Runner

    class OwnInterval(DatasetTriggeredTimetable):
        def data_interval_for_events(self, logical_date, events):
            return super().data_interval_for_events(logical_date, events)

    w = World("own_timetable")
    try:
        a = w.dataset("a")
        w.consumer("d", [a])
        p = w.producer("P")
        for second in (1, 2):
            w.clock.at(second), w.emit(p, a)
        p.finish()
        with create_session() as session:
            ids = sorted(
                session.scalars(
                    select(DatasetEvent.id)
                    .join(DatasetModel, DatasetModel.id == DatasetEvent.dataset_id)
                    .where(DatasetModel.uri == a.uri)
                ),
                reverse=True,
            )
            reads = [Runner._DatasetEventRead(event_id, 0, None, "producer", "gone") for event_id in ids]
            own = Runner._events_for_timetable(OwnInterval(a), reads, session)
            assert [(type(e), e.id) for e in own] == [(DatasetEvent, event_id) for event_id in ids]
            either = DatasetOrTimeSchedule(
                timetable=CronTriggerTimetable("@daily", timezone="UTC"), datasets=a
            )
            for timetable in (DatasetTriggeredTimetable(a), either):
                assert Runner._events_for_timetable(timetable, reads, session) is reads
                assert [e.source_dag_run for e in reads] == [None, None]
    finally:
        w.close()


def test_settings_are_read_once_a_process_and_again_when_their_variable_changes(monkeypatch):
    """Airflow's conf read costs 10-30 µs and a scheduler loop made 2-3 (issue 47: 1 % of a 3 ms loop)."""
    from airflow.configuration import conf

    from airflow_dataset_race_fix.fix.datasets.manager import DatasetManager

    reads, read = [], conf.getint
    monkeypatch.setattr(conf, "getint", lambda *args, **kwargs: reads.append(args) or read(*args, **kwargs))
    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__EVENT_LOOKBACK_SECONDS", "4711")
    assert [DatasetManager._dataset_race_fix_setting("event_lookback_seconds") for _ in range(3)] == [
        4711
    ] * 3
    assert len(reads) == 1, "read once"
    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__EVENT_LOOKBACK_SECONDS", "-4711")
    assert DatasetManager._dataset_race_fix_setting("event_lookback_seconds") == 0, "never below 0"
    assert len(reads) == 2, "read again when the variable changed"


def test_a_paced_step_saves_up_one_step_of_credit_after_a_pause():
    """10 ms saved up made a burst of sweep pages in the loops after a pause (issue 47: the round's share
    11-16 %)."""
    import time

    from airflow_dataset_race_fix.fix.jobs.scheduler_job_runner import SchedulerJobRunner

    sweep = SchedulerJobRunner._DatasetSweep(
        time.monotonic(), credit=-0.001, credit_at=time.monotonic() - 100
    )
    assert sweep.earn_credit() == 0.002  # 100 s idle: 3 s earned, one step kept
