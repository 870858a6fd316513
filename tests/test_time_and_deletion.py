"""
Time, deletion and upgrade edges (issue "Time, deletion and upgrade semantics"): each
test drives the decided behaviour deterministically on a real database.

- a producer whose clock runs a day ahead does not date this run, or any later one, in
  the future: its event waits until the database's clock gets there (SQLite, where the
  host's clock is the database's; the servers' cases are in ``test_commit_stamps.py``);
- data intervals never go backwards or overlap the previous run's;
- deleting the latest run gives its events back, as in stock; deleting an older one
  gives back only those within ``commit_latency_seconds``; ``airflow db clean`` keeps the
  run started last, which may be an older (cleared) or a scheduled run: the deleted runs'
  events are consumed again, as in stock, but at once instead of with the next event;
- during a rolling upgrade a producer still on stock code can strand an event; audit
  finds it and ``--requeue`` recovers it.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timedelta

import pytest
from airflow.datasets import DatasetAny
from airflow.models.dagrun import DagRun
from airflow.models.dataset import DatasetDagRunQueue, DatasetEvent, DatasetModel
from airflow.utils.session import create_session
from conftest import BACKEND
from sqlalchemy import delete, select, update

from airflow_dataset_race_fix import cli
from reproduce.harness.faults import run_producer
from reproduce.harness.world import DONE, PAUSED, World

DAY = 86_400


def _runs(dag_id: str) -> list[tuple]:
    """(logical date, data interval, consumed event timestamps) per run, in creation order."""
    with create_session() as session:
        return [
            (
                r.execution_date,
                (r.data_interval_start, r.data_interval_end),
                sorted(e.timestamp for e in r.consumed_dataset_events),
            )
            for r in session.scalars(select(DagRun).where(DagRun.dag_id == dag_id).order_by(DagRun.id))
        ]


class _Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _capture(actor) -> _Captured:
    handler = _Captured()
    actor.runner.log.addHandler(handler)
    actor.runner.log.setLevel(logging.INFO)
    return handler


@pytest.mark.skipif(
    BACKEND != "sqlite",
    reason="fixed producers date events on the server's clock; the servers' case, a stock producer "
    "whose host clock runs ahead, is in test_commit_stamps.py",
)
def test_a_producer_clock_a_day_ahead_dates_no_run_in_the_future(world):
    """SQLite: the host's clock is the database's, so a producer host ahead is the database's clock ahead."""
    w = world
    a = w.dataset("a")
    d = w.consumer("d", [a])
    p, ahead, s = w.producer("P"), w.producer("ahead"), w.scheduler()
    log = _capture(s)
    w.clock.at(1), w.emit(p, a), p.finish()
    w.clock.at(DAY + 3), w.emit(ahead, a), ahead.finish()  # its clock says tomorrow
    w.clock.at(2), w.loop(s), s.finish()
    w.clock.at(5), w.emit(p, a), p.finish()
    w.clock.at(6), w.loop(s), s.finish()
    w.clock.at(7), w.loop(s), s.finish()
    runs = _runs(d)
    assert [r[2] for r in runs] == [
        [w.clock.base + timedelta(seconds=1)],
        [w.clock.base + timedelta(seconds=5)],
    ]
    assert all(
        r[0] <= w.clock.base + timedelta(seconds=6 + 60) for r in runs
    )  # never ahead of the clock + 60 s
    assert len([m for m in log.messages if "ahead of the scheduler's clock" in m]) == 1  # once per DAG
    with create_session() as session:  # its queue row is gone (it took no slot), the event is waiting
        assert not session.scalar(
            select(DatasetDagRunQueue.dataset_id).where(DatasetDagRunQueue.target_dag_id == d)
        )
    assert w.report().by_dag()[d].future_dated == 1
    w.clock.at(DAY + 10), w.loop(s), s.finish()  # the clock got there: the sweep takes it, in order
    assert [len(r[2]) for r in _runs(d)] == [1, 1, 1]
    w.drain(s, start=DAY + 20)
    assert w.report().violations() == {}


def test_data_intervals_never_go_backwards_or_overlap(world):
    w = world
    a, b = w.dataset("a"), w.dataset("b")
    d = w.consumer("d", DatasetAny(a, b))
    p, lagging, s = w.producer("P"), w.producer("lagging"), w.scheduler()
    w.clock.at(1), w.emit(p, a), p.finish()
    w.clock.at(2), w.emit(p, b), p.finish()
    w.clock.at(3), w.loop(s), s.finish()  # run 1: its interval spans its two events
    # S6: an event dated inside (SQLite) or before (servers) run 1's interval: a lagging host
    # clock, which on the servers only a stock producer (during an upgrade) still dates with.
    if BACKEND == "sqlite":
        w.clock.at(1.5), w.emit(lagging, a), lagging.finish()
    else:
        w.clock.stop()
        run_producer(a.uri, fixed=False, clock_offset=-3600)
    w.clock.at(4), w.loop(s), s.finish()
    (_, first, first_events), (_, second, events) = _runs(d)
    assert first == tuple(first_events)
    assert len(events) == 1 and events[0] < first[1]
    assert second == (first[1], first[1])  # starts where run 1 ended (stock and the former fix: at the event)
    assert w.report().by_dag()[d].overlapping_intervals == 0
    w.drain(s, start=10)
    assert w.report().violations() == {}


def test_turning_the_fix_on_over_a_damaged_stock_history_adds_no_finding(world):
    """
    Issue 50: a stock history where run B's interval lies inside run A's (S6: an overlap audit
    counts), and an event no run consumed (queued). The fixed scheduler's run starts where B,
    the latest run, ended, which is before A's end: audit counts overlaps with the run just
    before (the one the scheduler reads by index), so that run is no new finding.
    """
    from airflow.models.dataset import DatasetEvent as Event
    from airflow.utils import timezone
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType

    w = world
    a = w.dataset("a")
    d = w.consumer("d", [a])
    s = w.scheduler()
    base = timezone.utcnow().replace(microsecond=0) - timedelta(seconds=100)
    at = lambda seconds: base + timedelta(seconds=seconds)  # noqa: E731
    with create_session() as session:
        dataset_id = session.scalar(select(DatasetModel.id).where(DatasetModel.uri == a.uri))
        events = {t: Event(dataset_id=dataset_id, timestamp=at(t)) for t in (10, 14, 15, 20)}
        session.add_all(events.values())
        for date, (start, end), consumed in ((30, (10, 20), (10, 20)), (40, (15, 15), (15,))):
            run = DagRun(
                dag_id=d,
                run_id=f"stock_{date}",
                run_type=DagRunType.DATASET_TRIGGERED,
                execution_date=at(date),
                data_interval=(at(start), at(end)),
                state=DagRunState.SUCCESS,
            )
            run.consumed_dataset_events.extend(events[t] for t in consumed)
            session.add(run)
        session.add(DatasetDagRunQueue(dataset_id=dataset_id, target_dag_id=d, created_at=at(14)))
    assert w.report().by_dag()[d].findings() == {"suspected_lost": 1, "overlapping_intervals": 1}
    w.loop(s), s.finish()
    *_, (_, interval, consumed) = _runs(d)
    assert consumed == [at(14)] and interval == (at(15), at(15))  # B's end, before A's (at 20)
    assert w.report().by_dag()[d].findings() == {"overlapping_intervals": 1}  # B's, from the stock history


@pytest.mark.skipif(BACKEND == "sqlite", reason="the scheduler holds SQLite's only write lock at its delete")
def test_a_stock_producer_during_a_rolling_upgrade_is_found_and_requeued(world, capsys):
    """A producer process not yet restarted (stock code) commits just before the fixed scheduler's delete."""
    w = world
    a = w.dataset("a")
    d = w.consumer("d", [a])
    p, s = w.producer("P"), w.scheduler()
    w.clock.stop()  # the stock child runs on the real clock: so does the rest of this test
    w.emit(p, a), p.finish()
    s.pause_before("delete from dataset_dag_run_queue", "from dataset_dag_run_queue force index")
    assert w.loop(s) == PAUSED  # run created; its queue row is about to be deleted as read
    run_producer(a.uri, fixed=False)  # stock: DO NOTHING / merge leaves the row as it was
    assert s.resume() == DONE
    s.finish()
    report = w.report().by_dag()[d]
    assert (report.produced, report.consumed, report.lost) == (2, 1, 1)  # stranded: no queue row
    capsys.readouterr()
    assert cli.main(["audit", "--json", "--dag-id", d]) in (
        0,
        1,
    )  # "not queued" alone is no finding (a paused DAG)
    found = json.loads(capsys.readouterr().out)
    assert [g["not_queued"] for g in found["findings"]["stranded"]] == [1]
    assert cli.main(["audit", "--requeue", "--yes", "--dag-id", d]) in (0, 1)
    w.drain(s, start=None)
    assert w.report().violations() == {}
    assert [len(r[2]) for r in _runs(d)] == [1, 1]


@pytest.mark.parametrize("deleted", ["latest", "older"])
def test_deleting_a_run_stock_and_fixed_alike(request, variant, deleted, monkeypatch):
    """
    Deleting the latest run gives its events back (stock too: its next window starts at the
    run before). An older run's events stay consumed when they lie more than
    commit_latency_seconds before the newest event the latest run consumed (stock: always).
    """
    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__COMMIT_LATENCY_SECONDS", "0")
    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__FULL_READ_INTERVAL_SECONDS", "100000")
    w = World(f"del_{deleted}_{variant}")
    try:
        a = w.dataset("a")
        d = w.consumer("d", [a])
        p, s = w.producer("P"), w.scheduler()
        w.clock.at(1), w.emit(p, a), p.finish()
        w.clock.at(2), w.loop(s), s.finish()  # R1 {E1} (the fixed scheduler's one full read)
        w.clock.at(3), w.emit(p, a), p.finish()
        w.clock.at(4), w.loop(s), s.finish()  # R2 {E2}
        with create_session() as session:  # what the REST API's delete_dag_run does
            runs = session.scalars(select(DagRun.id).where(DagRun.dag_id == d).order_by(DagRun.id)).all()
            session.execute(
                delete(DagRun)
                .where(DagRun.id == (runs[-1] if deleted == "latest" else runs[0]))
                .execution_options(synchronize_session="fetch")
            )
        w.clock.at(5), w.emit(p, a), p.finish()
        w.clock.at(6), w.loop(s), s.finish()
        with create_session() as session:
            e1, e2, e3 = session.scalars(
                select(DatasetEvent.id)
                .join(DatasetModel, DatasetModel.id == DatasetEvent.dataset_id)
                .where(DatasetModel.uri == a.uri)
                .order_by(DatasetEvent.id)
            ).all()
            consumed = [
                sorted(e.id for e in run.consumed_dataset_events)
                for run in session.scalars(select(DagRun).where(DagRun.dag_id == d).order_by(DagRun.id))
            ]
        assert consumed == ([[e1], [e2, e3]] if deleted == "latest" else [[e2], [e3]])
    finally:
        w.close()


@pytest.mark.parametrize("then", ["the same scheduler", "a restarted scheduler"])
@pytest.mark.parametrize("kept", ["a cleared older run", "a scheduled run"])
def test_db_clean_keeps_the_run_started_last(variant, kept, then, monkeypatch):
    """
    ``airflow db clean`` keeps, per DAG, the run with the newest ``start_date`` among those not
    externally triggered, not the latest run. Three dataset-triggered runs of one event each;
    then the first is cleared and runs again (its start date is now the newest), or, on a
    ``DatasetOrTimeSchedule``, a scheduled run starts last. db clean keeps that run alone, and
    the deleted runs' events are consumed again: by stock with the next event, by the fix at
    once (the sweep, every ``requeue_interval_seconds``; 0 here). The existing db clean test
    starts each run at its logical date, so the run kept there is the latest.
    """
    from airflow.models.taskinstance import TaskInstance, clear_task_instances
    from airflow.timetables.datasets import DatasetOrTimeSchedule
    from airflow.timetables.trigger import CronTriggerTimetable
    from airflow.utils import timezone
    from airflow.utils.db_cleanup import run_cleanup
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType

    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__REQUEUE_INTERVAL_SECONDS", "0")
    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__COMMIT_LATENCY_SECONDS", "1")
    w = World(f"clean_{kept.split()[1]}_{then.split()[1]}_{variant}")
    try:
        a = w.dataset("a")
        yearly = DatasetOrTimeSchedule(
            timetable=CronTriggerTimetable("0 0 1 1 *", timezone="UTC"), datasets=[a]
        )
        d = w.consumer("d", yearly if kept == "a scheduled run" else [a])
        p, s = w.producer("P"), w.scheduler()
        w.clock.stop()
        for _ in range(3):
            w.emit(p, a), p.finish()
            w.loop(s), s.finish()
            time.sleep(1.1)
        e1, e2, e3 = _event_ids(a)
        with create_session() as session:  # each ran when it was made
            ran = update(DagRun).where(DagRun.dag_id == d)
            session.execute(ran.values(start_date=DagRun.queued_at, state="success"))
        with create_session() as session:
            if kept == "a cleared older run":  # a user clears R1's task: R1 is queued, then starts again
                first = session.scalars(select(DagRun).where(DagRun.dag_id == d).order_by(DagRun.id)).first()
                tis = select(TaskInstance).where(TaskInstance.dag_id == d)
                tis = tis.where(TaskInstance.run_id == first.run_id)
                clear_task_instances(session.scalars(tis).all(), session)
                assert (first.state, first.start_date) == (DagRunState.QUEUED, None)
                first.state, first.start_date = DagRunState.SUCCESS, timezone.utcnow()
                kept_id = first.id
            else:  # the yearly run, dated at its cron instant, started after the dataset-triggered runs
                when = datetime(timezone.utcnow().year, 1, 1, tzinfo=timezone.utc)
                run = DagRun(
                    dag_id=d,
                    run_id=f"scheduled__{when.isoformat()}",
                    run_type=DagRunType.SCHEDULED,
                    execution_date=when,
                    data_interval=(when, when),
                    state=DagRunState.SUCCESS,
                    start_date=timezone.utcnow(),
                    external_trigger=False,
                )
                session.add(run)
                session.flush()
                kept_id = run.id
        run_cleanup(
            clean_before_timestamp=timezone.utcnow(),
            table_names=["dag_run"],
            dry_run=False,
            confirm=False,
            skip_archive=True,
        )
        with create_session() as session:
            assert session.scalars(select(DagRun.id).where(DagRun.dag_id == d)).all() == [kept_id]
        scheduler = s if then == "the same scheduler" else w.scheduler("restarted")
        for _ in range(5):
            w.loop(scheduler), scheduler.finish()
        again = _consumed_by_new_runs(d, kept_id)
        w.emit(p, a), p.finish()
        w.loop(scheduler), scheduler.finish()
        (e4,) = set(_event_ids(a)) - {e1, e2, e3}
        deleted = [e2, e3] if kept == "a cleared older run" else [e1, e2, e3]  # no dataset-triggered run left
        after_the_event = _consumed_by_new_runs(d, kept_id)[len(again) :]
        if variant == "stock":  # the next event's run takes the deleted runs' events again, with its own
            assert (again, after_the_event) == ([], [deleted + [e4]])
        else:  # the sweep runs them at once (they are newer than the kept run); the event runs alone
            assert (again, after_the_event) == ([deleted], [[e4]])
    finally:
        w.close()


def _event_ids(dataset) -> list[int]:
    with create_session() as session:
        return list(
            session.scalars(
                select(DatasetEvent.id)
                .join(DatasetModel, DatasetModel.id == DatasetEvent.dataset_id)
                .where(DatasetModel.uri == dataset.uri)
                .order_by(DatasetEvent.id)
            )
        )


def _consumed_by_new_runs(dag_id: str, kept_id: int) -> list[list[int]]:
    with create_session() as session:
        return [
            sorted(e.id for e in run.consumed_dataset_events)
            for run in session.scalars(
                select(DagRun).where(DagRun.dag_id == dag_id, DagRun.id != kept_id).order_by(DagRun.id)
            )
        ]
