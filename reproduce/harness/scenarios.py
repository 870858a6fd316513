"""
The race scenarios S1-S7 of ``docs/race-analysis`` as explicit interleavings.

Each scenario builds its own world, drives producers and a scheduler step by step (with
pauses at named SQL statements and real row-lock waits), drains the scheduler, and
returns the invariant report. ``expect_stock`` names the counters that stock Airflow
must show above zero; with the fix every violation counter must be zero.

Times are seconds on the world's clock. Backends: a scenario runs only where its
interleaving can happen (``harness.catalog``, which also holds ids, titles and
``expect_stock``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

from airflow.datasets import DatasetAny

from airflow_dataset_race_fix.diagnostics.invariant import Report
from reproduce.harness.catalog import CATALOG, ScenarioInfo
from reproduce.harness.world import BLOCKED, DONE, PAUSED, World


@dataclass(frozen=True)
class Scenario(ScenarioInfo):
    run: Callable[[World], None]


@dataclass
class Outcome:
    scenario: Scenario
    backend: str
    report: Report

    @property
    def violations(self) -> dict[str, int]:
        return self.report.violations()

    def shows_bug(self) -> bool:
        return all(self.report.total(name) > 0 for name in self.scenario.expect_stock)


def _expect(state: str, *allowed: str) -> None:
    if state not in allowed:
        raise AssertionError(f"interleaving broke: step ended {state!r}, expected one of {allowed}")


def s1_stale_queue_timestamp(w: World) -> None:
    """A queue row waits (DAG held at max_active_runs=1); a newer event keeps its old created_at."""
    a = w.dataset("a")
    w.consumer("d", [a], max_active_runs=1)
    p, s = w.producer("P"), w.scheduler()
    w.clock.at(1), w.emit(p, a), p.finish()
    w.clock.at(2), w.loop(s), s.finish()  # run 1 consumes E1 and stays queued
    w.clock.at(3), w.emit(p, a), p.finish()  # queue row at 3
    w.clock.at(4), w.loop(s), s.finish()  # held back: no room
    w.clock.at(5), w.emit(p, a), p.finish()  # stock: the row stays at 3
    w.finish_runs()
    w.clock.at(6), w.loop(s), s.finish()  # stock window (2, 3]: E3 is left out, its row deleted
    w.drain(s, start=10)


def s2_delete_during_processing(w: World) -> None:
    """A producer commits after the scheduler read the queue, before it wrote anything."""
    a = w.dataset("a")
    w.consumer("d", [a])
    p1, p2, s = w.producer("P1"), w.producer("P2"), w.scheduler()
    w.clock.at(1), w.emit(p1, a), p1.finish()
    w.clock.at(2)
    s.pause_before("from serialized_dag")  # dags_needing_dagruns has read the queue
    _expect(w.loop(s), PAUSED)
    _expect(w.emit(p2, a), DONE)
    p2.finish()
    s.finish()
    w.drain(s, start=10)


def s2_delete_at_the_delete(w: World) -> None:
    """A producer writes the queue row just before the scheduler's DELETE."""
    a = w.dataset("a")
    w.consumer("d", [a])
    p1, p2, s = w.producer("P1"), w.producer("P2"), w.scheduler()
    w.clock.at(1), w.emit(p1, a), p1.finish()
    w.clock.at(2)
    # Fixed MySQL deletes with the multi-table syntax, after taking the rows FOR UPDATE.
    s.pause_before("delete from dataset_dag_run_queue", "delete q from")
    _expect(w.loop(s), PAUSED)
    # Stock: nothing locks the row, P2 commits. Fixed on MySQL: the scheduler took the row
    # (FOR UPDATE SKIP LOCKED) just before, so P2's commit waits for the scheduler's.
    _expect(w.emit(p2, a), DONE, BLOCKED)
    s.finish()
    p2.finish()
    w.drain(s, start=10)


def s3_late_commit(w: World) -> None:
    """P1 flushes E1 at t=1 and commits after a run made of a later event (E2 at t=2)."""
    a, b = w.dataset("a"), w.dataset("b")
    w.consumer("d", DatasetAny(a, b))
    p1, p2, p3, s = w.producer("P1"), w.producer("P2"), w.producer("P3"), w.scheduler()
    w.clock.at(1), _expect(w.emit(p1, a, commit=False), DONE), p1.finish()  # open transaction
    w.clock.at(2), w.emit(p2, b), p2.finish()
    w.clock.at(3)
    state = w.loop(s)  # run at 2 with E2; E1 is invisible
    if state == BLOCKED:  # stock MySQL's DELETE waits for P1's uncommitted queue row
        w.commit(p1), p1.finish()
        s.finish()
    else:
        s.finish()
        w.clock.at(3.5), w.commit(p1), p1.finish()
    w.clock.at(4), w.emit(p3, b), p3.finish()
    w.clock.at(5), w.loop(s), s.finish()  # stock window (2, 4]: E1 at 1 is never taken
    w.drain(s, start=10)


def s4_row_for_consumed_events(w: World) -> None:
    """A producer commits between the scheduler's queue read and its event selection."""
    a = w.dataset("a")
    w.consumer("d", [a])
    p1, p2, s = w.producer("P1"), w.producer("P2"), w.scheduler()
    w.clock.at(1), w.emit(p1, a), p1.finish()
    w.clock.at(2)
    s.pause_before("from dataset_event")
    _expect(w.loop(s), PAUSED)
    # Fixed on PostgreSQL: the scheduler holds the queue row it read, so P2 waits for it.
    _expect(w.emit(p2, a), DONE, BLOCKED)
    s.finish()
    p2.finish()
    # Fixed: the run took E2 too and its queue row survived; the next loop must neither
    # create an empty run nor keep the row.
    w.drain(s, start=10)


def s5_phantom_run(w: World) -> None:
    """P1's event is flushed at t=1 but its queue row is written at t=3, after a run at 2."""
    a = w.dataset("a")
    w.consumer("d", [a])
    p1, p2, s = w.producer("P1"), w.producer("P2"), w.scheduler()
    w.clock.at(1)
    p1.pause_after("insert into dataset_event")  # between the event flush and the queue write
    _expect(w.emit(p1, a), PAUSED)
    w.clock.at(2), w.emit(p2, a), p2.finish()
    w.clock.at(2.5), w.loop(s), s.finish()  # run at 2 consumes E2
    w.clock.at(3), p1.resume(), p1.finish()  # queue row at 3, E1 at 1
    w.clock.at(4), w.loop(s), s.finish()  # stock window (2, 3] is empty: a run with no event
    w.drain(s, start=10)


def s6_out_of_order(w: World) -> None:
    """A producer whose clock lags writes a queue row dated before the latest run."""
    a, b = w.dataset("a"), w.dataset("b")
    w.consumer("d", DatasetAny(a, b))
    p, lagging, s = w.producer("P"), w.producer("lagging"), w.scheduler()
    w.clock.at(1), w.emit(p, a), p.finish()
    w.clock.at(2), w.emit(p, b), p.finish()
    w.clock.at(3), w.loop(s), s.finish()  # run at 2 with E1 (a) and E2 (b)
    w.clock.at(1.5), w.emit(lagging, a), lagging.finish()  # its clock says 1.5
    w.clock.at(4), w.loop(s), s.finish()  # stock: a run at 1.5 taking E1 again
    w.drain(s, start=10)


def s7_merge_conflict(w: World) -> None:
    """Two producers insert the same queue key at once (stock: merge in a SAVEPOINT)."""
    a = w.dataset("a")
    w.consumer("d", [a])
    p1, p2, s = w.producer("P1"), w.producer("P2"), w.scheduler()
    w.clock.at(1), _expect(w.emit(p1, a, commit=False), DONE), p1.finish()
    w.clock.at(2)
    # Stock: P2 waits on P1's uncommitted key. Fixed: P1 writes its queue row at its commit,
    # so P2 goes first and P1's commit then moves the row forward.
    _expect(w.emit(p2, a), BLOCKED, DONE)
    w.commit(p1), p1.finish()
    p2.finish()  # stock: IntegrityError swallowed, the row keeps created_at 1
    w.clock.at(3), w.loop(s), s.finish()  # stock window (.., 1]: E2 is left out
    w.drain(s, start=10)


_INTERLEAVINGS = {
    "S1": s1_stale_queue_timestamp,
    "S2": s2_delete_during_processing,
    "S2b": s2_delete_at_the_delete,
    "S3": s3_late_commit,
    "S4": s4_row_for_consumed_events,
    "S5": s5_phantom_run,
    "S6": s6_out_of_order,
    "S7": s7_merge_conflict,
}
SCENARIOS = tuple(
    Scenario(**{f.name: getattr(info, f.name) for f in fields(ScenarioInfo)}, run=_INTERLEAVINGS[info.id])
    for info in CATALOG
)


def run_scenario(scenario: Scenario) -> Outcome:
    world = World(scenario.id)
    try:
        scenario.run(world)
        return Outcome(scenario, world.backend, world.report())
    finally:
        world.close()
