"""
What the net finds is kept in the database (a ``log`` row, "dataset-race-fix-finding") until the
run that consumes its event commits, driven deterministically on a real database. Each case lost
the late event when the net kept its finds in the scheduler's memory:

- an AND condition not met when the event is found: the run made once its partner's event
  arrives consumes it (stock consumes it too);
- a loop that fails after the find (an ``OperationalError`` on the run's link insert, retried by
  ``retry_db_transaction``), or a scheduler that dies before its COMMIT: the retry, or a
  restarted scheduler, consumes it (stock consumes it too);
- a DAG deactivated for a moment (its file missing for a parse) when the late commit lands: the
  run after it is active again consumes it;
- the fix turned off with a finding pending: stock reads nothing of it, and makes no phantom or
  doubled run.
"""

from __future__ import annotations

import time

import pytest
from airflow import settings
from airflow.models import Log
from airflow.models.dag import DagModel
from airflow.utils.session import create_session
from conftest import BACKEND, SOURCE_MODE
from sqlalchemy import event, func, select, update
from sqlalchemy.exc import OperationalError
from test_commit_stamps import _pause
from test_safety_net import LATENCY, _consumed, _events

from reproduce.harness.world import DONE, PAUSED, World

pytestmark = pytest.mark.skipif(
    BACKEND == "sqlite", reason="a producer paused before its COMMIT holds SQLite's one writer"
)
FINDING = "dataset-race-fix-finding"


def _findings(dag_id: str) -> int:
    with create_session() as session:
        return session.scalar(
            select(func.count()).select_from(Log).where(Log.event == FINDING, Log.dag_id == dag_id)
        )


def _set_active(dag_id: str, active: bool) -> None:
    with create_session() as session:
        session.execute(update(DagModel).where(DagModel.dag_id == dag_id).values(is_active=active))


def caught_up(w: World, s) -> None:
    """
    Loops of ``s`` until its net has read every committed id (a new scheduler reads on from the
    newest mark, which the tests before left in this session's database) and probed every late
    event among them.
    """
    from airflow.models.dataset import DatasetEvent

    for _ in range(40):
        w.loop(s), s.finish()
        net = s.runner.__dict__.get("_dataset_race_fix_net", {})
        with create_session() as session:
            newest = session.scalar(select(func.max(DatasetEvent.id))) or 0
        if net.get("high", -1) >= newest and not net.get("late"):
            return
        time.sleep(0.5)
    raise AssertionError("the net did not catch up in 40 loops")


def late_commit(w: World, schedule: str, before_commit=lambda d: None):
    """
    P is stamped on ``k`` while the DAG is paused (so it writes no queue row), stalls past
    ``commit_latency_seconds`` (1 s: the caller sets it), R's events make run 2 above P's stamp,
    ``before_commit(d)`` runs, P commits. ``schedule``: "k" or "k and m". Returns the DAG, P's
    event id, the scheduler and the datasets.
    """
    k, m = w.dataset("k"), w.dataset("m")
    datasets = [k, m] if schedule == "k and m" else [k]
    d = w.consumer("d", datasets)
    q, p, r, s = w.producer("Q"), w.producer("P"), w.producer("R"), w.scheduler()
    w.clock.stop()  # real time: the server's clock stamps everything
    caught_up(w, s)
    for dataset in datasets:
        w.emit(q, dataset), q.finish()
    w.loop(s), s.finish()  # run 1
    _pause(d, True)
    p.pause_after("update dataset_event")  # P is stamped; its COMMIT stalls
    assert w.emit(p, k) == PAUSED
    _pause(d, False)
    time.sleep(1.5)  # the stall: longer than commit_latency_seconds
    for dataset in datasets:
        w.emit(r, dataset), r.finish()
    w.loop(s), s.finish()  # run 2: R's events, above P's stamp
    assert len(_consumed(d)) == 2
    before_commit(d)
    assert p.resume() == DONE
    p.finish()
    late = max(set(_events(w)) - set(sum(_consumed(d), [])))
    return d, late, s, datasets


def test_an_and_dags_late_event_is_consumed_once_its_condition_is_met(world, monkeypatch):
    """
    The net finds P's event on k for ``[k, m]``; m has nothing new, so no run, and the finding
    stays. With the finding in memory, the decision popped it, read P's event, made no run, and
    the next run started above it: lost for good, where stock consumes it in its third run.
    """
    monkeypatch.setenv(LATENCY, "1")
    w = world
    d, late, s, (k, m) = late_commit(w, "k and m")
    time.sleep(0.6)  # the net looks at the ids every half second
    for _ in range(3):
        w.loop(s), s.finish()
    assert len(_consumed(d)) == 2, "a run without m's event"
    assert _findings(d) == 1, "the finding was not kept while the condition waits"
    q = w.producer("Q2")
    w.emit(q, k), q.finish()
    w.emit(q, m), q.finish()
    w.drain(s, start=None)
    assert late in _consumed(d)[2], f"P's late event {late} not in the run its condition made: {_consumed(d)}"
    assert sorted(sum(_consumed(d), [])) == sorted(_events(w))
    assert _findings(d) == 0, "the finding outlived the run that consumed its event"
    assert w.report().violations() == {}


@pytest.mark.parametrize(
    "fault",
    ["on the run's link insert", "on the net's finding insert", "the scheduler dies before its COMMIT"],
)
def test_a_loop_that_fails_after_the_find_loses_nothing(world, monkeypatch, fault):
    """
    The loop that would consume P's event fails after the net found it: an ``OperationalError``
    once on the run's link insert, or on the finding's own insert (``retry_db_transaction`` runs
    the loop again at once), or the scheduler dies before its COMMIT and another one starts. The
    finding was committed on its own, or the failed look undone: the retry or the new scheduler
    consumes it. In memory, the find was popped by the failed decision and lost.
    """
    monkeypatch.setenv(LATENCY, "1")
    w = world
    d, late, s, _ = late_commit(w, "k")
    time.sleep(0.6)
    if fault != "the scheduler dies before its COMMIT":
        failed, target = [], "INSERT INTO dagrun_dataset_event" if "link" in fault else "INSERT INTO log"

        def fail_once(conn, cursor, statement, parameters, context, executemany):
            if statement.startswith(target) and not failed:
                failed.append(statement)
                raise OperationalError(statement, parameters, Exception("injected: deadlock found"))

        event.listen(settings.engine, "before_cursor_execute", fail_once)
        try:
            w.loop(s), s.finish()
        finally:
            event.remove(settings.engine, "before_cursor_execute", fail_once)
        assert failed, "the fault never fired: the net did not bring the DAG in"
        scheduler = s
    else:
        s.pause_before("insert into dagrun_dataset_event")
        assert w.loop(s) == PAUSED  # the net's finding is committed; the run is not
        assert _findings(d) == 1
        s.abort()
        with pytest.raises(Exception):
            s.finish()
        scheduler = w.scheduler("restarted")
        w.loop(scheduler), scheduler.finish()
    assert late in sum(_consumed(d), []), f"P's late event {late} was lost: {_consumed(d)}"
    w.drain(scheduler, start=None)
    assert sorted(sum(_consumed(d), [])) == sorted(_events(w))
    assert _findings(d) == 0
    assert w.report().violations() == {}


def test_a_dag_deactivated_for_a_moment_consumes_what_committed_meanwhile(world, monkeypatch):
    """
    The DAG's file is missing for a parse (``is_active`` false) when P's late commit lands and the
    net looks: the probe reads every consumer, the finding waits, and the DAG's first loop once it
    is active again consumes it. The net skipped inactive consumers and forgot their finds.
    """
    monkeypatch.setenv(LATENCY, "1")
    w = world
    d, late, s, _ = late_commit(w, "k", before_commit=lambda d: _set_active(d, False))
    time.sleep(0.6)
    for _ in range(2):
        w.loop(s), s.finish()
    assert len(_consumed(d)) == 2, "an inactive DAG ran"
    _set_active(d, True)
    w.loop(s), s.finish()
    assert late in sum(_consumed(d), []), f"P's late event {late} was lost: {_consumed(d)}"
    assert w.report().violations() == {}


@pytest.mark.skipif(SOURCE_MODE, reason="source-patched: stock Airflow is not in this env")
def test_turning_the_fix_off_with_a_finding_pending_makes_no_phantom_or_doubled_run(world, monkeypatch):
    """
    A finding waits (an AND condition), then the fix is turned off: stock ignores ``log`` rows, so
    its runs are those of its own queue rows: no run without events, no event consumed twice.
    """
    import airflow_dataset_race_fix

    monkeypatch.setenv(LATENCY, "1")
    w = world
    d, late, s, (k, m) = late_commit(w, "k and m")
    time.sleep(0.6)
    w.loop(s), s.finish()
    assert _findings(d) == 1
    airflow_dataset_race_fix.unapply()
    stock = w.scheduler("stock")
    q = w.producer("Q2")
    w.emit(q, k), q.finish()
    w.emit(q, m), q.finish()
    w.drain(stock, start=None)
    runs = _consumed(d)
    assert all(runs), f"stock made a run without events: {runs}"
    consumed = sum(runs, [])
    assert len(consumed) == len(set(consumed)), f"an event consumed twice: {runs}"
    assert len(runs) == 3


def test_a_full_late_queue_loses_nothing_and_says_so(world, monkeypatch):
    """
    The net follows at most 100 000 late events: one past that is dropped, counted
    (``dataset_race_fix.net_ids_dropped``) and logged, and read again as new from its id when the
    queue has room, which finds it. Before, it was dropped without a word, and lost. (A look every
    loop: ``net_look_interval_seconds`` 0.)
    """
    from airflow.stats import Stats

    monkeypatch.setenv(LATENCY, "1")
    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__NET_LOOK_INTERVAL_SECONDS", "0")
    counted = []
    monkeypatch.setattr(Stats, "incr", lambda name, count=1, *args, **kwargs: counted.append((name, count)))
    w = world
    runners = []

    def fill_the_late_queue(d):
        net = runners[0].__dict__["_dataset_race_fix_net"]
        net["late"] = [(-1, -1, None)] * 100_000  # events of no dataset: their probes find nobody

    original = World.scheduler

    def scheduler(self, name="scheduler"):
        actor = original(self, name)
        runners.append(actor.runner)
        return actor

    monkeypatch.setattr(World, "scheduler", scheduler)
    d, late, s, _ = late_commit(w, "k", before_commit=fill_the_late_queue)
    w.loop(s), s.finish()  # P's event appears past the cap: dropped, and the ids followed from below it again
    assert ("dataset_race_fix.net_ids_dropped", 1) in counted
    assert late not in sum(_consumed(d), [])
    s.runner.__dict__["_dataset_race_fix_net"][
        "late"
    ] = []  # as if the 100 000 were probed (5 to 1 000 a look)
    for _ in range(3):
        w.loop(s), s.finish()
    assert late in sum(_consumed(d), []), "the dropped late event was lost"
    assert w.report().violations() == {}


@pytest.mark.parametrize("then", ["the restarted scheduler", "a second scheduler, started first"])
def test_a_restart_resumes_where_the_ids_were_followed(world, monkeypatch, then):
    """
    P's late COMMIT lands while no scheduler runs (the upgrade procedure stops them all), and the
    DAG's next run (the restarted scheduler's, or a second scheduler's started just before) lies
    more than ``event_lookback_seconds`` (5 here) past P's stamp. The restarted scheduler reads
    the ids from where the last one followed them (its mark: P's id was missing there) and
    consumes P's event within its first loops. A window pass from the latest run less the
    look-back never reached it (stock loses it too).
    """
    monkeypatch.setenv(LATENCY, "1")
    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__EVENT_LOOKBACK_SECONDS", "8")
    w = world
    d, late, s, (k,) = late_commit(w, "k")  # s saw P's id missing and marked it; then it stops
    with create_session() as session:
        marks = session.scalar(
            select(func.count()).select_from(Log).where(Log.event == "dataset-race-fix-followed")
        )
    assert marks >= 1, "the scheduler left no mark of where it followed the ids"
    time.sleep(9)  # longer than the look-back: the next run lies past P's stamp by more than that
    q = w.producer("Q2")
    w.emit(q, k), q.finish()
    if then != "the restarted scheduler":
        other = w.scheduler("second")
        w.loop(other), other.finish()  # run 3, past the look-back
    restarted = w.scheduler("restarted")
    loops = 0
    while late not in sum(_consumed(d), []) and loops < 6:
        w.loop(restarted), restarted.finish()
        loops += 1
        time.sleep(0.6)  # a look every half second
    assert late in sum(_consumed(d), []), f"P's late event {late} lost after a restart: {_consumed(d)}"
    assert sorted(sum(_consumed(d), [])) == sorted(_events(w))
    assert w.report().violations() == {}
