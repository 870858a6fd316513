"""
Commit-time event stamps on the database's clock, and the floor they allow (the look-back
issue's decided design), each driven deterministically on a real database:

- an event is dated at its COMMIT on the database's clock, whatever the producer host's
  clock says, and so is its queue row;
- host clocks off by an hour (producer) or two minutes (scheduler) defer, stall and
  misdate nothing;
- a commit paused after its stamp is consumed by the next run, made by the same
  scheduler or by another one;
- a commit slower than ``commit_latency_seconds`` waits for the scheduler's next full
  read (the safety net), and is consumed once, never lost or doubled;
- a database clock stepped back loses nothing and dates nothing ahead: stamps stay
  forward-only per dataset;
- a stock producer's stamp ten minutes ahead (a rolling upgrade) never moves the floor
  past events that commit after it.

Server clocks cannot be moved by ``time-machine``: these tests move the fix's clock
expression (``DatasetManager._database_clock``) instead, which is real SQL on the real
server. SQLite's clock is this host's, moved by the world's clock.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from airflow.datasets import DatasetAny
from airflow.models.dag import DagModel
from airflow.models.dagrun import DagRun
from airflow.models.dataset import DatasetDagRunQueue, DatasetEvent, DatasetModel
from airflow.utils.session import create_session
from conftest import BACKEND
from sqlalchemy import select, update

from reproduce.harness.faults import run_producer
from reproduce.harness.world import BLOCKED, DONE, PAUSED, Aborted, World

servers_only = pytest.mark.skipif(BACKEND == "sqlite", reason="SQLite has one writer and this host's clock")
LATENCY = "AIRFLOW__DATASET_RACE_FIX__COMMIT_LATENCY_SECONDS"
FULL_READ = "AIRFLOW__DATASET_RACE_FIX__FULL_READ_INTERVAL_SECONDS"
SERVER_CLOCK = {"postgres": "clock_timestamp()", "mysql": "NOW(6)"}


def _manager():
    from airflow.datasets.manager import DatasetManager

    return DatasetManager


def _db_now():
    with create_session() as session:
        return _manager()._database_now(session)


def _move_server_clock(monkeypatch, seconds: int) -> None:
    """The database clock the fix reads, moved by ``seconds`` (PostgreSQL or MySQL SQL)."""
    shifted = {
        "postgres": f"(clock_timestamp() + interval '{seconds} seconds')",
        "mysql": f"(NOW(6) + INTERVAL {seconds} SECOND)",
    }[BACKEND]
    monkeypatch.setattr(_manager(), "_database_clock", classmethod(lambda cls, dialect_name: shifted))


def _events(w: World) -> list[tuple[int, object]]:
    """(id, timestamp) of the world's events, in id order."""
    with create_session() as session:
        return session.execute(
            select(DatasetEvent.id, DatasetEvent.timestamp)
            .join(DatasetModel, DatasetModel.id == DatasetEvent.dataset_id)
            .where(DatasetModel.uri.startswith(f"race://{w.prefix}/"))
            .order_by(DatasetEvent.id)
        ).all()


def _runs(dag_id: str) -> list[tuple[object, list[int]]]:
    """(logical date, consumed event ids) per dataset-triggered run, in creation order."""
    with create_session() as session:
        return [
            (r.execution_date, sorted(e.id for e in r.consumed_dataset_events))
            for r in session.scalars(select(DagRun).where(DagRun.dag_id == dag_id).order_by(DagRun.id))
        ]


def _pause(dag_id: str, paused: bool) -> None:
    with create_session() as session:
        session.execute(update(DagModel).where(DagModel.dag_id == dag_id).values(is_paused=paused))


def test_an_event_is_dated_at_its_commit_on_the_databases_clock(world):
    w = world
    a = w.dataset("a")
    d = w.consumer("d", [a])
    p = w.producer("P")
    # SQLite: the host's clock is the database's; move it between flush and commit. Servers:
    # the producer host's clock runs two hours behind the server's (the world's base is an
    # hour back) and does not matter.
    w.clock.at(1 if BACKEND == "sqlite" else -3600)
    assert w.emit(p, a, commit=False) == DONE
    p.finish()
    if BACKEND == "sqlite":
        w.clock.at(5)
    before = _db_now()
    w.commit(p), p.finish()
    after = _db_now()
    ((_, stamp),) = _events(w)
    assert before <= stamp <= after
    with create_session() as session:
        created_at = session.scalar(
            select(DatasetDagRunQueue.created_at).where(DatasetDagRunQueue.target_dag_id == d)
        )
    # the queue row on the same clock, dated just after its event, as Airflow orders them
    # (its test_outlet_datasets checks it; a stock scheduler selects events up to created_at)
    assert stamp < created_at <= after + timedelta(microseconds=1)


def test_queue_rows_are_dated_after_the_events_they_announce(world):
    """
    Airflow's order (2.10's ``test_outlet_datasets``): every queue row a producer writes is
    dated after the events it announces, for a task with two outlets in either order, each
    with two consumers, an existing row and a new one, on every backend.
    """
    w = world
    a, b = w.dataset("a"), w.dataset("b")
    w.consumer("d", [a, b]), w.consumer("e", DatasetAny(a, b))
    p = w.producer("P")
    w.clock.stop()
    for first, second in ((a, b), (b, a), (a, b)):  # new rows first, then existing ones
        w.emit(p, first, commit=False), p.finish()
        w.emit(p, second, commit=False), p.finish()
        w.commit(p), p.finish()
        with create_session() as session:
            newest = dict(
                session.execute(
                    select(DatasetEvent.dataset_id, DatasetEvent.timestamp)
                    .join(DatasetModel, DatasetModel.id == DatasetEvent.dataset_id)
                    .where(DatasetModel.uri.startswith(f"race://{w.prefix}/"))
                    .order_by(DatasetEvent.id)
                ).all()
            )
            rows = session.execute(
                select(DatasetDagRunQueue.dataset_id, DatasetDagRunQueue.created_at).where(
                    DatasetDagRunQueue.target_dag_id.in_(w.dag_ids)
                )
            ).all()
        assert len(rows) == 4
        assert all(newest[dataset_id] < created_at for dataset_id, created_at in rows), (newest, rows)


@servers_only
@pytest.mark.parametrize("producer_offset", [-3600, 3600])
def test_host_clocks_off_defer_stall_and_misdate_nothing(world, producer_offset):
    w = world
    a = w.dataset("a")
    d = w.consumer("d", [a])
    p, s = w.producer("P"), w.scheduler()
    real = (_db_now() - w.clock.base).total_seconds()  # world seconds that are the server's now
    w.clock.at(real + producer_offset), w.emit(p, a), p.finish()  # the producer host: an hour off
    w.clock.at(real - 120), w.loop(s), s.finish()  # the scheduler host: two minutes behind
    w.clock.at(real + producer_offset), w.emit(p, a), p.finish()
    w.clock.at(real - 120), w.loop(s), s.finish()
    after = _db_now()
    (first, second) = [event_id for event_id, _ in _events(w)]
    runs = _runs(d)
    assert [consumed for _, consumed in runs] == [[first], [second]]  # each at once: nothing deferred
    assert all(logical_date <= after for logical_date, _ in runs)  # none dated in the future
    assert runs[0][0] < runs[1][0]
    assert w.report().violations() == {}


@servers_only
@pytest.mark.parametrize("next_run_by", ["the same scheduler", "another scheduler"])
def test_a_commit_paused_after_its_stamp_is_consumed_by_the_next_run(world, monkeypatch, next_run_by):
    monkeypatch.setenv(FULL_READ, "100000")  # the same scheduler reads the window once, at its first loop
    w = world
    a, b = w.dataset("a"), w.dataset("b")
    d = w.consumer("d", DatasetAny(a, b))
    p, q, s = w.producer("P"), w.producer("Q"), w.scheduler()
    w.clock.stop()  # real time: the server's clock dates everything
    w.emit(q, a), q.finish()
    w.loop(s), s.finish()  # run 1, and this scheduler's full read
    # The (a, d) queue row exists, so P's upsert updates it: P locks that row only, not d's
    # DAG row (a new queue row would hold a foreign-key lock on it, and the scheduler skips
    # a locked DAG row: stock's producers hold that lock from their flush on).
    w.emit(q, a), q.finish()
    p.pause_after("update dataset_event")  # stamped, queue row locked, COMMIT not sent
    assert w.emit(p, a) == PAUSED
    w.emit(q, b), q.finish()
    assert w.loop(s) == DONE  # run 2: Q's a and b events; P's is not visible yet, its row is skipped
    s.finish()
    assert p.resume() == DONE
    p.finish()
    scheduler = s if next_run_by == "the same scheduler" else w.scheduler("other")
    w.loop(scheduler), scheduler.finish()
    first, second, late, third = [event_id for event_id, _ in _events(w)]
    assert [consumed for _, consumed in _runs(d)] == [[first], [second, third], [late]]
    assert w.report().violations() == {}


def test_the_same_scheduler_reads_again_what_its_last_read_left(world, monkeypatch):
    """
    A scheduler remembers where its last read of a DAG's dataset left nothing to find, and its
    next read starts there rather than at the newest consumed event: the lower of the latency
    before its clock and the oldest event it left. Here the loop that read a2 and a3 rolls back
    (a scheduler killed before its COMMIT), and a3 dated the queue row 1.5 s after a2: neither
    the row nor the clock brings a2 back, only the memory of what the read left. Fails if the
    memory keeps only the clock.
    """
    monkeypatch.setenv(LATENCY, "1")
    monkeypatch.setenv(FULL_READ, "100000")
    w = world
    a = w.dataset("a")
    d = w.consumer("d", [a])
    q, s = w.producer("Q"), w.scheduler()
    w.clock.stop()  # real time: the database's clock (SQLite: this host's) dates everything
    w.emit(q, a), q.finish()
    w.loop(s), s.finish()  # run 1: a1
    w.emit(q, a), q.finish()  # a2
    time.sleep(1.5)  # past the latency
    w.emit(q, a), q.finish()  # a3: the (a, d) row is dated 1.5 s after a2
    s.pause_before("insert into dag_run")  # the loop has read a2 and a3
    assert w.loop(s) == PAUSED
    assert s.abort() == DONE
    with pytest.raises(Aborted):
        s.finish()
    w.loop(s), s.finish()  # the same scheduler again
    a1, a2, a3 = [event_id for event_id, _ in _events(w)]
    assert [consumed for _, consumed in _runs(d)] == [[a1], [a2, a3]]
    assert w.report().violations() == {}


@servers_only
def test_each_dag_reads_from_its_own_floor(world, monkeypatch):
    """
    The floor is each DAG's own: what *its* latest run consumed. d and e consume ``a``. P's
    event writes no queue row for d (d is paused when P registers) and commits late, after
    e's latest run took events stamped two latencies after P's. d's next run must read from
    its own latest run, not from e's (whose floor lies above P's stamp). Fails when the
    newest consumed event is looked up in another DAG's latest run.
    """
    monkeypatch.setenv(LATENCY, "1")
    w = world
    a = w.dataset("a")
    d, e = w.consumer("d", [a]), w.consumer("e", [a])
    p, q, s = w.producer("P"), w.producer("Q"), w.scheduler()
    w.clock.stop()  # real time: the server's clock dates everything
    for _ in range(2):  # first runs, then second runs: a loop that reads their windows in full
        w.emit(q, a), q.finish()
        w.loop(s), s.finish()
    _pause(d, True)
    w.emit(q, a), q.finish()  # e's queue row exists: P updates it, and locks nothing of d's
    p.pause_after("update dataset_event")
    assert w.emit(p, a) == PAUSED
    time.sleep(2.2)  # twice the commit latency
    w.emit(q, a), q.finish()  # e's row is P's: left out, still queued by its committed row
    assert w.loop(s) == DONE  # e's second run; d is paused
    s.finish()
    assert p.resume() == DONE
    p.finish()
    _pause(d, False)
    w.emit(q, a), q.finish()
    time.sleep(0.5)  # the net looks at the ids at most every half second
    w.loop(s), s.finish()
    first, second, third, late, fourth, fifth = [event_id for event_id, _ in _events(w)]
    assert [consumed for _, consumed in _runs(d)] == [[first], [second], [third, late, fourth, fifth]]
    # For e, P's commit took longer than the latency (and Q moved e's queue row on since): the
    # net, following the event ids, finds it in the same loop, and e's run takes it too.
    assert [consumed for _, consumed in _runs(e)] == [[first], [second], [third, fourth], [late, fifth]]
    assert w.report().violations() == {}


@servers_only
def test_a_producer_that_waits_for_a_new_queue_row_stamps_after_the_wait(world):
    """
    The floor's argument needs the stamp taken once the queue rows are locked. A and B
    produce the first event on ``a`` for X: both insert the new (a, X) row. A stops after
    its write, before its COMMIT; B's insert waits for A's. A commits 0.5 s later: B's stamp
    must come after that wait, not from before it (on PostgreSQL the rows and the stamp
    are one statement, whose clock is read only after its upsert).
    """
    w = world
    a = w.dataset("a")
    x = w.consumer("x", [a])
    first, second, s = w.producer("A"), w.producer("B"), w.scheduler()
    w.clock.stop()  # real time: the server's clock dates everything
    first.pause_after("update dataset_event")
    assert w.emit(first, a) == PAUSED
    assert w.emit(second, a) == BLOCKED  # on A's uncommitted insert of (a, X)
    time.sleep(0.5)
    assert first.resume() == DONE
    first.finish(), second.finish()
    (_, a_stamp), (_, b_stamp) = _events(w)
    assert b_stamp - a_stamp >= timedelta(seconds=0.5), (a_stamp, b_stamp)
    # B took the row A inserted once A committed, and dated it after its own event.
    with create_session() as session:
        row_dates = select(DatasetDagRunQueue.created_at).where(DatasetDagRunQueue.target_dag_id == x)
        (row_date,) = session.scalars(row_dates)
    assert row_date > b_stamp, (row_date, b_stamp)
    w.drain(s, start=None)
    assert [consumed for _, consumed in _runs(x)] and w.report().violations() == {}


@servers_only
def test_a_commit_slower_than_the_latency_is_consumed_by_the_next_loop(world, monkeypatch):
    """
    The safety net: a stamp older than the floor, with no queue row to pull the floor down. The
    scheduler follows the event ids: P's appears stamped more than the latency before the clock.
    """
    monkeypatch.setenv(LATENCY, "1")
    w = world
    a = w.dataset("a")
    d = w.consumer("d", [a])
    p, q, s = w.producer("P"), w.producer("Q"), w.scheduler()
    w.clock.stop()
    w.emit(q, a), q.finish()
    w.loop(s), s.finish()  # run 1
    _pause(d, True)  # P registers while d is paused: P writes no queue row for d
    p.pause_after("update dataset_event")
    assert w.emit(p, a) == PAUSED
    _pause(d, False)
    time.sleep(2.2)  # twice the commit latency
    w.emit(q, a), q.finish()
    w.loop(s), s.finish()  # run 2: Q's event, stamped 2.2 s after P's
    assert p.resume() == DONE
    p.finish()
    w.emit(q, a), q.finish()
    time.sleep(0.5)  # the net looks at the ids at most every half second
    w.loop(s), s.finish()  # run 3: P's stamp lies below the floor; the net found it
    e1, slow, e2, e3 = [event_id for event_id, _ in _events(w)]
    assert [consumed for _, consumed in _runs(d)] == [[e1], [e2], sorted([slow, e3])]
    w.drain(s, start=None)
    assert w.report().violations() == {}


def first_run_before_a_clock_step(w: World):
    """
    d on ``a``, producer P and a scheduler; run 1 made. Returns ``(a, d, P, scheduler, at)``,
    ``at(s)`` moving SQLite's clock (this host's) to second ``s``; the servers' clocks run on.
    """
    a = w.dataset("a")
    d = w.consumer("d", [a])
    p, s = w.producer("P"), w.scheduler()

    def at(seconds: float) -> None:
        if BACKEND == "sqlite":
            w.clock.at(seconds)

    at(1), w.emit(p, a), p.finish()
    at(2), w.loop(s), s.finish()  # run 1
    return a, d, p, s, at


@pytest.mark.parametrize("step_back", [30, 3600], ids=["30s", "1h"])
def test_a_database_clock_stepped_back_loses_nothing_and_dates_nothing_ahead(world, monkeypatch, step_back):
    monkeypatch.setenv(FULL_READ, "100000")
    w = world
    a, d, p, s, at = first_run_before_a_clock_step(w)
    before_step = _db_now()
    if BACKEND == "sqlite":
        at(3 - step_back)
    else:
        _move_server_clock(monkeypatch, -step_back)
    w.emit(p, a), p.finish()
    at(4 - step_back), w.loop(s), s.finish()  # run 2, on the stepped clock
    (first, first_stamp), (second, second_stamp) = _events(w)
    if step_back < 60:  # within max_event_ahead_seconds: the stamp stays after the dataset's newest event
        assert second_stamp > first_stamp
    else:  # an hour: the stamp is the stepped clock's; the queue row brings the event in all the same
        assert second_stamp < first_stamp
    runs = _runs(d)
    assert [consumed for _, consumed in runs] == [[first], [second]]
    assert runs[0][0] < runs[1][0] <= before_step + timedelta(seconds=1)  # in order, not ahead
    assert w.report().violations() == {}


@servers_only
def test_a_stock_stamp_ten_minutes_ahead_never_moves_the_floor_past_later_commits(world, monkeypatch):
    """A stock producer process during a rolling upgrade, on a host whose clock runs 10 minutes ahead."""
    w = world
    a, b = w.dataset("a"), w.dataset("b")
    d = w.consumer("d", DatasetAny(a, b))
    p, s = w.producer("P"), w.scheduler()
    w.clock.stop()
    run_producer(a.uri, fixed=False, clock_offset=600)  # dated (and its queue row) 10 minutes ahead
    w.emit(p, a), p.finish()  # fixed: the server's clock (the stock stamp is not followed)
    w.loop(s), s.finish()  # run 1: the fixed event; the stock one waits for the clock
    w.emit(p, a), p.finish()
    w.emit(p, b), p.finish()
    w.loop(s), s.finish()  # run 2: both
    now = _db_now()
    ahead, e2, e3, e4 = [event_id for event_id, _ in _events(w)]
    runs = _runs(d)
    assert [consumed for _, consumed in runs] == [[e2], [e3, e4]]
    assert all(logical_date <= now for logical_date, _ in runs)  # nothing dated in the future
    _move_server_clock(monkeypatch, 660)  # the clock reaches the stock event
    w.loop(s), s.finish()
    assert [consumed for _, consumed in _runs(d)] == [[e2], [e3, e4], [ahead]]
    w.emit(p, b), p.finish()
    w.loop(s), s.finish()
    assert len(_runs(d)) == 4
    assert w.report().violations() == {}
