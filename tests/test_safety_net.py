"""
The net under the commit-stamp floor (``SchedulerJobRunner._dags_with_stranded_dataset_events``),
driven deterministically on a real database:

- a commit slower than ``commit_latency_seconds`` on a busy queue row, followed by a DAG that
  nothing decides again (no new event, no queue row): its event is consumed within
  ``full_read_interval_seconds`` and a loop, by the same scheduler and by a restarted one
  (issue 30, section 1; on the code before the net it was never consumed, while stock
  Airflow consumed it);
- a database clock stepped back an hour while a queue row is pending: the event stamped on
  the stepped clock is consumed at once; the one stamped before the step waits until the
  clock is back where it was (it is dated ahead of the clock), and is consumed then.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from airflow.models.dagrun import DagRun
from airflow.models.dataset import DatasetEvent, DatasetModel
from airflow.utils.session import create_session

from reproduce.harness.world import DONE, PAUSED, Actor, World

from conftest import BACKEND

servers_only = pytest.mark.skipif(BACKEND == "sqlite", reason="a producer paused before its COMMIT holds SQLite's one writer")
LATENCY = "AIRFLOW__DATASET_RACE_FIX__COMMIT_LATENCY_SECONDS"
FULL_READ = "AIRFLOW__DATASET_RACE_FIX__FULL_READ_INTERVAL_SECONDS"


def _events(w: World) -> list[int]:
    with create_session() as session:
        return list(
            session.scalars(
                select(DatasetEvent.id)
                .join(DatasetModel, DatasetModel.id == DatasetEvent.dataset_id)
                .where(DatasetModel.uri.startswith(f"race://{w.prefix}/"))
                .order_by(DatasetEvent.id)
            )
        )


def _consumed(dag_id: str) -> list[list[int]]:
    with create_session() as session:
        return [
            sorted(e.id for e in run.consumed_dataset_events)
            for run in session.scalars(select(DagRun).where(DagRun.dag_id == dag_id).order_by(DagRun.id))
        ]


def strand_a_late_commit(w: World) -> tuple[str, dict[str, int], Actor]:
    """
    Issue 30's interleaving, up to the point where nothing else happens to the DAG: P is
    stamped, holds the busy queue row and stalls past ``commit_latency_seconds`` (set to 1 by
    the caller) before its COMMIT; R commits and leaves the row out; a loop runs; P commits
    and Q2 moves the row past P's stamp before the next loop, which takes Q2's event only.
    Returns the DAG, the event ids by name (``late`` is P's, consumed by no run yet) and the scheduler.
    """
    k = w.dataset("k")
    d = w.consumer("d", [k])
    p, q, r, q2, s = w.producer("P"), w.producer("Q"), w.producer("R"), w.producer("Q2"), w.scheduler()
    w.clock.stop()  # real time: the server's clock stamps everything
    w.emit(q, k), q.finish()
    w.loop(s), s.finish()  # run 1: Q's event; the (k, d) queue row is gone
    w.emit(q, k), q.finish()  # the row is queued again
    p.pause_after("update dataset_event")  # P is stamped and holds the row; its COMMIT stalls
    assert w.emit(p, k) == PAUSED
    time.sleep(2.5)  # the stall: longer than commit_latency_seconds
    w.emit(r, k), r.finish()  # R's event leaves the busy row out
    w.loop(s), s.finish()  # run 2: Q's and R's events; the row P holds is skipped
    assert p.resume() == DONE
    p.finish()
    w.emit(q2, k), q2.finish()  # moves the row past P's stamp
    w.loop(s), s.finish()  # run 3: Q2's event only (P's stamp lies below its floor)
    ids = dict(zip(("first", "second", "late", "third", "fourth"), _events(w)))
    assert _consumed(d) == [[ids["first"]], [ids["second"], ids["third"]], [ids["fourth"]]]
    return d, ids, s


@servers_only
@pytest.mark.parametrize("then", ["the same scheduler", "a restarted scheduler"])
def test_a_late_commit_on_a_quiet_dag_is_consumed_within_the_full_read_interval(world, monkeypatch, then):
    full_read = 3
    monkeypatch.setenv(LATENCY, "1")
    monkeypatch.setenv(FULL_READ, str(full_read))
    w = world
    d, ids, s = strand_a_late_commit(w)
    late = ids["late"]
    # Nothing else happens to d: no event, no queue row. The net must still find P's event.
    scheduler = s if then == "the same scheduler" else w.scheduler("restarted")
    began = time.monotonic()
    while late not in sum(_consumed(d), []) and time.monotonic() - began < full_read + 6:
        w.loop(scheduler), scheduler.finish()
        time.sleep(0.25)
    took = time.monotonic() - began
    assert _consumed(d)[3:] == [[late]], f"not consumed after {took:.1f} s"
    # within full_read_interval_seconds and a loop (a second and a half for one on a busy CI machine)
    assert took <= full_read + 1.5, took
    w.drain(scheduler, start=None)
    assert w.report().violations() == {}


def test_a_database_clock_stepped_back_with_a_queue_row_pending(world, monkeypatch):
    """
    An hour's step back while a queue row waits: the event committed on the stepped clock is
    stamped an hour before the latest run (forward-only stamps do not follow a newest event
    that now looks an hour ahead). The scheduler reads below its clock in full while the clock
    is behind the latest run, so that event is consumed at once; the pending one, stamped
    before the step, is dated ahead of the clock now and waits until the clock gets back there.
    """
    from test_commit_stamps import _db_now, _move_server_clock, first_run_before_a_clock_step

    monkeypatch.setenv(FULL_READ, "100000")  # no net read in this test: the step alone
    w = world
    a, d, p, s, at = first_run_before_a_clock_step(w)
    at(3), w.emit(p, a), p.finish()  # pending: its queue row waits for the next loop
    if BACKEND == "sqlite":
        at(4 - 3600)
    else:
        _move_server_clock(monkeypatch, -3600)
    w.emit(p, a), p.finish()  # stamped on the stepped clock
    at(5 - 3600), w.loop(s), s.finish()
    first, pending, stepped = _events(w)
    assert _consumed(d) == [[first], [stepped]]
    # the clock comes back: the pending event is consumed, in a run dated after the others
    if BACKEND == "sqlite":
        at(6)
    else:
        monkeypatch.undo()
        monkeypatch.setenv(FULL_READ, "100000")
    w.drain(s, start=7 if BACKEND == "sqlite" else None)
    assert _consumed(d) == [[first], [stepped], [pending]]
    assert _db_now() is not None and w.report().violations() == {}
