"""
What the net finds is kept in the database (a ``log`` row, "dataset-race-fix-finding") until the
run that consumes its event commits, driven deterministically on a real database. Each case lost
the late event when the net kept its finds in the scheduler's memory:

- an AND condition not met when the event is found: the run made once its partner's event
  arrives consumes it;
- a loop that fails after the find (an ``OperationalError`` on the run's link insert, retried by
  ``retry_db_transaction``), or a scheduler that dies before its COMMIT: the retry, or a
  restarted scheduler, consumes it;
- a DAG deactivated for a moment (its file missing for a parse) when the late commit lands: the
  run after it is active again consumes it;
- the fix turned off with a finding pending: stock reads nothing of it, and makes no phantom or
  doubled run.

Stock Airflow, driven through the same steps (the last test), loses the late event in each case:
its window starts above it. It consumes nothing that the fix does not.
"""

from __future__ import annotations

import time

import pytest
from airflow import settings
from airflow.models import Log
from airflow.models.dag import DagModel
from airflow.utils.session import create_session
from airflow.utils.sqlalchemy import prohibit_commit
from conftest import BACKEND, SOURCE_MODE
from sqlalchemy import event, func, select, update
from sqlalchemy.exc import OperationalError
from test_commit_stamps import _pause
from test_safety_net import LATENCY, _consumed, _events

from reproduce.harness.world import DONE, PAUSED, Aborted, World

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
        net = s.runner.__dict__.get("_dataset_race_fix_net")
        with create_session() as session:
            newest = session.scalar(select(func.max(DatasetEvent.id))) or 0
        if net is not None and net.high is not None and net.high >= newest and not (net.late or net.below):
            return
        time.sleep(0.5)
    raise AssertionError("the net did not catch up in 40 loops")


def late_commit(w: World, schedule: str, before_commit=lambda d: None, *, stock: bool = False):
    """
    P is stamped on ``k`` while the DAG is paused (so it writes no queue row), stalls past
    ``commit_latency_seconds`` (1 s: the caller sets it), R's events make run 2 above P's stamp,
    ``before_commit(d)`` runs, P commits. ``schedule``: "k" or "k and m". ``stock``: the same steps
    on stock Airflow (P is dated at its flush, and holds its transaction open from there). Returns
    the DAG, P's event id, the scheduler and the datasets.
    """
    k, m = w.dataset("k"), w.dataset("m")
    datasets = [k, m] if schedule == "k and m" else [k]
    d = w.consumer("d", datasets)
    q, p, r, s = w.producer("Q"), w.producer("P"), w.producer("R"), w.scheduler()
    w.clock.stop()  # real time: the server's clock stamps everything
    if stock:
        w.loop(s), s.finish()  # (no net to catch up: a loop that finds nothing to do)
    else:
        caught_up(w, s)
    for dataset in datasets:
        w.emit(q, dataset), q.finish()
    w.loop(s), s.finish()  # run 1
    _pause(d, True)
    if stock:
        assert w.emit(p, k, commit=False) == DONE  # P is dated at its flush; its COMMIT stalls
    else:
        p.pause_after("update dataset_event")  # P is stamped; its COMMIT stalls
        assert w.emit(p, k) == PAUSED
    _pause(d, False)
    time.sleep(1.5)  # the stall: longer than commit_latency_seconds
    for dataset in datasets:
        w.emit(r, dataset), r.finish()
    w.loop(s), s.finish()  # run 2: R's events, above P's stamp
    assert len(_consumed(d)) == 2
    before_commit(d)
    assert (w.commit(p) if stock else p.resume()) == DONE
    p.finish()
    late = max(set(_events(w)) - set(sum(_consumed(d), [])))
    return d, late, s, datasets


def test_an_and_dags_late_event_is_consumed_once_its_condition_is_met(world, monkeypatch):
    """
    The net finds P's event on k for ``[k, m]``; m has nothing new, so no run, and the finding
    stays. With the finding in memory, the decision popped it, read P's event, made no run, and
    the next run started above it: lost for good (as in stock: its window starts above it).
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


def _loop_failing_once(w: World, s, target: str) -> list[str]:
    """One loop of ``s`` in which the first statement starting with ``target`` raises an
    ``OperationalError`` (as a deadlock would); the statements that failed."""
    failed: list[str] = []

    def fail_once(conn, cursor, statement, parameters, context, executemany):
        if statement.startswith(target) and not failed:
            failed.append(statement)
            raise OperationalError(statement, parameters, Exception("injected: deadlock found"))

    event.listen(settings.engine, "before_cursor_execute", fail_once)
    try:
        w.loop(s), s.finish()
    finally:
        event.remove(settings.engine, "before_cursor_execute", fail_once)
    return failed


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
        failed = _loop_failing_once(
            w, s, "INSERT INTO dagrun_dataset_event" if "link" in fault else "INSERT INTO log"
        )
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
        net.late = [(-1, -1, None)] * 100_000  # events of no dataset: their probes find nobody

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
    s.runner.__dict__["_dataset_race_fix_net"].late = []  # as if the 100 000 were probed (5 to 1 000 a look)
    for _ in range(3):
        w.loop(s), s.finish()
    assert late in sum(_consumed(d), []), "the dropped late event was lost"
    assert w.report().violations() == {}


def test_findings_that_no_run_settles_hide_no_newer_finding(world, monkeypatch):
    """
    500 findings of DAGs deleted since (``delete_dag`` keeps their ``log`` rows; a DAG whose file
    is gone, paused or rescheduled, or an AND condition waiting, keeps them too) lie before P's:
    nothing settles them. The net reads its findings 500 at a time from where the last read
    ended, so P's is read at the next look: its DAG comes into a loop and consumes P's event.
    """
    from airflow.utils import timezone

    monkeypatch.setenv(LATENCY, "1")
    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__NET_LOOK_INTERVAL_SECONDS", "0")
    w = world

    def findings_of_deleted_dags(d):
        with create_session() as session:
            for i in range(500):
                row = Log(FINDING, extra='{"event_id": 1}')
                row.dag_id, row.map_index, row.execution_date = f"{w.prefix}_gone{i}", 1, timezone.utcnow()
                session.add(row)

    d, late, s, _ = late_commit(w, "k", before_commit=findings_of_deleted_dags)
    for _ in range(3):
        w.loop(s), s.finish()
    assert late in sum(_consumed(d), []), f"P's late event {late} waits behind 500 findings: {_consumed(d)}"
    assert _findings(d) == 0, "the run that consumed P's event left its finding"


def test_a_new_process_reads_at_most_20_dags_with_findings_a_loop_and_decides_each(world, monkeypatch):
    """
    30 DAGs hold a finding each (P's event on k, no queue row: they were paused), and a scheduler process
    starts, its dag bag empty. A loop reads at most 20 DAGs from their serialization (300 read at once took
    750 ms of a first loop after a stop), in turn; each DAG consumes P's event once in the loops after.
    """
    from airflow.models.dagbag import DagBag
    from airflow.models.dataset import DatasetEvent, DatasetModel

    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__REQUEUE_INTERVAL_SECONDS", "1000")  # no sweep round
    w = world
    k = w.dataset("k")
    dag_ids = w.consumers("c", [k], 30)
    p = w.producer("P")
    w.clock.stop()
    for dag_id in dag_ids:
        _pause(dag_id, True)
    w.emit(p, k), p.finish()
    for dag_id in dag_ids:
        _pause(dag_id, False)
    with create_session() as session:
        event_id, dataset_id, stamp = session.execute(
            select(DatasetEvent.id, DatasetEvent.dataset_id, DatasetEvent.timestamp)
            .join(DatasetModel, DatasetModel.id == DatasetEvent.dataset_id)
            .where(DatasetModel.uri == k.uri)
        ).one()
        for dag_id in dag_ids:
            row = Log(FINDING, extra=f'{{"event_id": {event_id}}}')
            row.dag_id, row.map_index, row.execution_date = dag_id, dataset_id, stamp
            session.add(row)
    reads: list[str] = []
    read = DagBag._add_dag_from_db

    def counted(self, dag_id, session):
        reads.append(dag_id)
        return read(self, dag_id, session)

    monkeypatch.setattr(DagBag, "_add_dag_from_db", counted)
    s, per_loop = w.scheduler(), []
    while len(per_loop) < 20 and any(_consumed(dag_id) != [[event_id]] for dag_id in dag_ids):
        reads.clear()
        w.loop(s), s.finish()
        w.finish_runs()
        per_loop.append(len(reads))
    assert per_loop[0] == 20 and max(per_loop) <= 20, per_loop
    assert all(_consumed(dag_id) == [[event_id]] for dag_id in dag_ids), per_loop
    assert sum(_findings(dag_id) for dag_id in dag_ids) == 0


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


def test_the_follow_mark_waits_for_no_wal_flush_and_the_findings_do(world, monkeypatch):
    """
    The follow mark is advisory: lost to a server crash, the next process reads on from an older
    mark (what committed since is read again as late). On PostgreSQL its transaction commits
    without waiting for the WAL flush (``SET LOCAL synchronous_commit TO OFF``: 0.5 ms, not
    3-10 ms); a finding's transaction, which must outlive a crash, waits for it as any other.
    MariaDB has no such setting a transaction: both commit as configured.
    """
    monkeypatch.setenv(LATENCY, "1")
    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__NET_LOOK_INTERVAL_SECONDS", "0")
    statements: dict[int, list[str]] = {}  # per DBAPI connection, in order

    def record(conn, cursor, statement, parameters, context, executemany):
        statements.setdefault(id(conn.connection.dbapi_connection), []).append(statement.lower())

    w = world
    event.listen(settings.engine, "before_cursor_execute", record)
    try:
        d, late, s, _ = late_commit(w, "k")
        for _ in range(6):
            if late in sum(_consumed(d), []):
                break
            w.loop(s), s.finish()
            time.sleep(0.6)
    finally:
        event.remove(settings.engine, "before_cursor_execute", record)
    assert late in sum(_consumed(d), []), f"P's late event {late} not consumed: {_consumed(d)}"
    marks, findings = 0, 0
    for executed in statements.values():
        for before, statement in zip(["", *executed], executed):
            asynchronous = before == "set local synchronous_commit to off"
            # the net's rows (Airflow's audit rows name a task_id); a finding names its dataset in map_index
            if statement.startswith(("insert into log ", "update log ")) and "task_id" not in statement:
                writes_mark = "map_index" not in statement
                marks, findings = marks + writes_mark, findings + (not writes_mark)
                assert asynchronous == (writes_mark and BACKEND == "postgres"), (before, statement)
    assert marks >= 1 and findings >= 1, f"{marks} mark and {findings} finding writes seen"


@pytest.mark.skipif(SOURCE_MODE, reason="source-patched: stock Airflow is not in this env")
def test_a_first_start_after_stock_finds_what_no_run_consumed(variant_fixed, monkeypatch):
    """
    The upgrade from stock: stock's P commits late below run 2 (stock loses it), every scheduler
    stops, and the first fixed scheduler starts with no mark (none of stock's). It reads the last
    10 000 ids again and consumes P's event within its first loops. Of that re-read, only the events
    that no run consumed are late: run 1's and run 2's events are not probed (at fan-out, their links
    are what made a first start take minutes).
    """
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner

    import airflow_dataset_race_fix

    monkeypatch.setenv(LATENCY, "1")
    airflow_dataset_race_fix.unapply()
    w = World("first_start")
    try:
        d, late, _, _ = late_commit(w, "k", stock=True)
        assert late not in sum(_consumed(d), [])
        airflow_dataset_race_fix.apply(strict=True)
        with create_session() as session:  # a first start: no process followed the ids before
            session.execute(Log.__table__.delete().where(Log.event == "dataset-race-fix-followed"))
        found, queued = [], set()  # what the net found for d; every event it queued as late
        follow, both_ends = SchedulerJobRunner._follow_dataset_event_ids, SchedulerJobRunner._both_ends

        def recording(self, net, session):
            finds = follow(self, net, session)
            found.extend(event_id for dag_id, _, event_id, _ in finds if dag_id == d)
            return finds

        def queue_recorded(items, size):
            queued.update(item[0] for item in items)
            return both_ends(items, size)

        monkeypatch.setattr(SchedulerJobRunner, "_follow_dataset_event_ids", recording)
        monkeypatch.setattr(SchedulerJobRunner, "_both_ends", staticmethod(queue_recorded))
        consumed_before = set(sum(_consumed(d), []))
        s = w.scheduler("fixed")
        for _ in range(6):
            if late in sum(_consumed(d), []):
                break
            w.loop(s), s.finish()
            time.sleep(0.6)  # a look every half second
        assert late in sum(_consumed(d), []), f"P's late event {late} lost at a first start: {_consumed(d)}"
        assert found == [late], f"the first start found {found}"
        assert late in queued and not queued & consumed_before, "the first start probed consumed events"
        assert w.report().violations() == {}
    finally:
        w.close()


def test_an_event_one_consumer_did_not_consume_is_found_for_it_alone(world, monkeypatch):
    """
    The net finds a late event for each consumer that did not consume it, not for those that did.
    E was consumed by d1's run 2 but not by d2's (its link removed:
    d2's run read before E committed), and lies in a restarted scheduler's backlog: it is found
    for d2 alone, d2's next run consumes it, and d1 does not consume it again.
    """
    from airflow.models.dagrun import DagRun
    from airflow.models.dataset import association_table
    from airflow.utils import timezone

    monkeypatch.setenv(LATENCY, "1")
    w = world
    k = w.dataset("k")
    d1, d2 = w.consumer("d1", [k]), w.consumer("d2", [k])
    q, s = w.producer("Q"), w.scheduler()
    caught_up(w, s)
    for _ in range(2):  # run 1, then run 2 with E (not below the oldest run: BUG_REPORT section 8)
        w.emit(q, k), q.finish()
        w.loop(s), s.finish()
    first, e = sorted(_events(w))
    assert _consumed(d1) == [[first], [e]] and _consumed(d2) == [[first], [e]]
    with create_session() as session:  # d2's run did not consume E; the next process reads on from below it
        d2_runs = select(DagRun.id).where(DagRun.dag_id == d2)
        session.execute(
            association_table.delete().where(
                association_table.c.event_id == e, association_table.c.dag_run_id.in_(d2_runs)
            )
        )
        session.execute(Log.__table__.delete().where(Log.event == "dataset-race-fix-followed"))
        extra = f'{{"high": {e - 1}, "missing": []}}'
        mark = {"dttm": timezone.utcnow(), "event": "dataset-race-fix-followed", "extra": extra}
        session.execute(Log.__table__.insert().values(mark))
    restarted = w.scheduler("restarted")
    for _ in range(3):
        w.loop(restarted), restarted.finish()
    assert _consumed(d1) == [[first], [e]], f"d1 consumed E again: {_consumed(d1)}"
    assert e in sum(_consumed(d2)[2:], []), f"d2 did not consume E again: {_consumed(d2)}"
    assert _findings(d1) == 0 and _findings(d2) == 0


def test_a_dag_queued_again_after_its_findings_were_consumed_is_decided(world, monkeypatch):
    """
    A run consumes a DAG's only finding; before the net reads its findings again (no look: the
    interval is long), a producer queues the DAG again. The next loop decides it as any queued DAG:
    it failed on ``min()`` of the DAG's findings, left empty in the process by the consuming run.
    """
    monkeypatch.setenv(LATENCY, "1")
    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__NET_LOOK_INTERVAL_SECONDS", "0")
    w = world
    d, late, s, (k,) = late_commit(w, "k")
    for _ in range(6):
        if late in sum(_consumed(d), []):
            break
        w.loop(s), s.finish()
    assert late in sum(_consumed(d), []), f"P's late event {late} not consumed: {_consumed(d)}"
    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__NET_LOOK_INTERVAL_SECONDS", "600")  # no look, no re-read
    q = w.producer("Q3")
    w.emit(q, k), q.finish()
    assert w.loop(s) == DONE
    s.finish()
    assert max(_events(w)) in sum(_consumed(d), []), f"Q3's event not consumed: {_consumed(d)}"
    assert w.report().violations() == {}


# -- never worse than stock, on the same interleaving ------------------------------------------------
# Each case is the interleaving of a test above, its world steps only, driven once on stock Airflow
# (producers and scheduler) and once on the fix (the net looks every loop: no half-second waits).
# "a full late queue" fills the net's queue, which stock has not: on stock its steps are the others'.
NEVER_WORSE = {
    "an AND condition": "test_an_and_dags_late_event_is_consumed_once_its_condition_is_met",
    "a link insert fails": "test_a_loop_that_fails_after_the_find_loses_nothing[on the run's link ...]",
    "a finding insert fails": "test_a_loop_that_fails_after_the_find_loses_nothing[on the net's finding ...]",
    "the scheduler dies": "test_a_loop_that_fails_after_the_find_loses_nothing[the scheduler dies ...]",
    "deactivated for a moment": "test_a_dag_deactivated_for_a_moment_consumes_what_committed_meanwhile",
    "a full late queue": "test_a_full_late_queue_loses_nothing_and_says_so",
    "a restart": "test_a_restart_resumes_where_the_ids_were_followed[the restarted scheduler]",
    "a second scheduler first": "test_a_restart_resumes_where_the_ids_were_followed[a second scheduler, ...]",
}
# What stock loses of these interleavings (the fix loses nothing): P's late event ("P"), each time.
STOCK_LOSES = dict.fromkeys(NEVER_WORSE, {"P"})


def _loop_dying_before_its_commit(s) -> None:
    """A loop of ``s`` that does all its work and dies just before its COMMIT: its transaction rolls back."""

    def step(session):
        with prohibit_commit(session) as guard:

            def die() -> None:
                raise Aborted("the scheduler dies before its COMMIT")

            guard.commit = die
            s.runner._create_dagruns_for_dags(guard=guard, session=session)

    s.do(step)
    with pytest.raises(Aborted):
        s.finish()


def _drive(w: World, case: str, stock: bool) -> tuple[str, int]:
    """``case``'s interleaving (``NEVER_WORSE``) on ``w``; returns its DAG and P's late event."""

    def loops(scheduler, count: int) -> None:
        for _ in range(count):
            w.loop(scheduler), scheduler.finish()

    if case == "an AND condition":
        d, late, s, (k, m) = late_commit(w, "k and m", stock=stock)
        loops(s, 3)
        q = w.producer("Q2")
        w.emit(q, k), q.finish()
        w.emit(q, m), q.finish()
    elif case in ("a link insert fails", "a finding insert fails"):
        d, late, s, _ = late_commit(w, "k", stock=stock)
        # stock: no run to link, no finding: the fault never fires
        failed = _loop_failing_once(
            w, s, "INSERT INTO dagrun_dataset_event" if "link" in case else "INSERT INTO log"
        )
        assert stock or failed, "the fault never fired: the net did not bring the DAG in"
    elif case == "the scheduler dies":
        d, late, s, _ = late_commit(w, "k", stock=stock)
        _loop_dying_before_its_commit(s)
        s = w.scheduler("restarted")
    elif case == "deactivated for a moment":
        d, late, s, _ = late_commit(w, "k", before_commit=lambda d: _set_active(d, False), stock=stock)
        loops(s, 2)
        _set_active(d, True)
    elif case == "a full late queue":

        def fill_the_late_queue(d):  # events of no dataset: their probes find nobody
            if not stock:
                (scheduler,) = (actor for actor in w.actors if hasattr(actor, "runner"))
                scheduler.runner.__dict__["_dataset_race_fix_net"].late = [(-1, -1, None)] * 100_000

        d, late, s, _ = late_commit(w, "k", before_commit=fill_the_late_queue, stock=stock)
        loops(s, 1)  # P's event appears past the cap: dropped
        if not stock:
            s.runner.__dict__["_dataset_race_fix_net"].late = []  # as if the 100 000 were probed
        loops(s, 3)
    else:  # a restart: no scheduler while P commits; the next run lies past the look-back (8 s)
        d, late, s, (k,) = late_commit(w, "k", stock=stock)
        time.sleep(9)
        q = w.producer("Q2")
        w.emit(q, k), q.finish()
        if case == "a second scheduler first":
            loops(w.scheduler("second"), 1)
        s = w.scheduler("restarted")
    loops(s, 3)
    w.drain(s, start=None)
    return d, late


def _labelled(w: World, d: str, late: int) -> tuple[list[list[str]], list[str]]:
    """``d``'s runs and the world's events, each named by its place in id order and dataset ("P": P's)."""
    from airflow.models.dataset import DatasetEvent, DatasetModel

    with create_session() as session:
        rows = session.execute(
            select(DatasetEvent.id, DatasetModel.uri)
            .join(DatasetModel, DatasetModel.id == DatasetEvent.dataset_id)
            .where(DatasetModel.uri.startswith(f"race://{w.prefix}/"))
            .order_by(DatasetEvent.id)
        ).all()
    names = {event_id: f"{i}:{uri.rsplit('/', 1)[1]}" for i, (event_id, uri) in enumerate(rows, 1)}
    names[late] = "P"
    return [[names[e] for e in run] for run in _consumed(d)], sorted(names.values())


@pytest.mark.skipif(SOURCE_MODE, reason="source-patched: stock Airflow is not in this env")
@pytest.mark.parametrize("case", list(NEVER_WORSE))
def test_the_fix_consumes_every_event_stock_consumes_on_the_same_interleaving(
    variant_fixed, monkeypatch, case
):
    """
    Issue 57: each interleaving above where stock Airflow can run, driven step by step on stock and on
    the fix, in two worlds. Every event stock consumes, the fix consumes too; neither makes a run without
    events or consumes an event twice; the fix consumes every event, and stock loses ``STOCK_LOSES``.
    """
    import airflow_dataset_race_fix

    monkeypatch.setenv(LATENCY, "1")
    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__NET_LOOK_INTERVAL_SECONDS", "0")
    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__EVENT_LOOKBACK_SECONDS", "8")
    outcome = {}
    for variant in ("stock", "fixed"):
        airflow_dataset_race_fix.unapply()
        if variant == "fixed":
            airflow_dataset_race_fix.apply(strict=True)
        w = World(f"worse_{variant}")
        try:
            d, late = _drive(w, case, stock=variant == "stock")
            outcome[variant] = _labelled(w, d, late)
        finally:
            w.close()
    for variant, (runs, events) in outcome.items():
        consumed = sum(runs, [])
        assert all(runs), f"{variant}: a run without events: {runs}"
        assert len(consumed) == len(set(consumed)), f"{variant}: an event consumed twice: {runs}"
    (stock_runs, events), (fixed_runs, fixed_events) = outcome["stock"], outcome["fixed"]
    assert events == fixed_events, "the two worlds did not take the same steps"
    stock_consumed, fixed_consumed = set(sum(stock_runs, [])), set(sum(fixed_runs, []))
    assert stock_consumed <= fixed_consumed, (
        f"stock consumed {stock_consumed - fixed_consumed}; the fix did not"
    )
    assert fixed_consumed == set(events), f"the fix lost {set(events) - fixed_consumed}: {fixed_runs}"
    print(f"{case} on {BACKEND}: stock {stock_runs}, fixed {fixed_runs}")
    assert set(events) - stock_consumed == STOCK_LOSES[case], (stock_runs, fixed_runs)
