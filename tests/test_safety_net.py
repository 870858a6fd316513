"""
The net under the commit-stamp floor (``SchedulerJobRunner._dags_with_stranded_dataset_events``),
driven deterministically on a real database:

- a commit slower than ``commit_latency_seconds`` on a busy queue row, below the DAG's latest
  run, whether or not anything else happens to the DAG: the same scheduler consumes it at its
  next loop (it follows the event ids), a restarted one within a few (it reads each window once);
- a database clock stepped back an hour while a queue row is pending: the event stamped on
  the stepped clock is consumed at once; the one stamped before the step waits until the
  clock is back where it was (it is dated ahead of the clock), and is consumed then.
"""

from __future__ import annotations

import time

import pytest
from airflow.models.dagrun import DagRun
from airflow.models.dataset import DatasetEvent, DatasetModel
from airflow.utils.session import create_session
from conftest import BACKEND
from sqlalchemy import func, select, update

from reproduce.harness.world import DONE, PAUSED, Actor, World

servers_only = pytest.mark.skipif(
    BACKEND == "sqlite", reason="a producer paused before its COMMIT holds SQLite's one writer"
)
LATENCY = "AIRFLOW__DATASET_RACE_FIX__COMMIT_LATENCY_SECONDS"


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


def commit_late_after_a_run(
    w: World, quiet: bool = False, before_r=lambda: None
) -> tuple[str, dict[str, int], Actor]:
    """
    Issue 30's interleaving, up to the late COMMIT: P is stamped, holds the busy queue row and
    stalls past ``commit_latency_seconds`` (set to 1 by the caller) before its COMMIT; R commits
    and leaves the row out; a loop takes Q's and R's events (its floor lies above P's stamp from
    then on); P commits. ``quiet``: P registers while the DAG is paused, so it writes no queue
    row: nothing brings the DAG into a loop again. Returns the DAG, the event ids by name
    (``late`` is P's) and the scheduler.
    """
    from test_commit_stamps import _pause

    k = w.dataset("k")
    d = w.consumer("d", [k])
    p, q, r, s = w.producer("P"), w.producer("Q"), w.producer("R"), w.scheduler()
    w.clock.stop()  # real time: the server's clock stamps everything
    w.emit(q, k), q.finish()
    w.loop(s), s.finish()  # run 1: Q's event; the (k, d) queue row is gone
    w.emit(q, k), q.finish()  # the row is queued again
    _pause(d, quiet)
    p.pause_after("update dataset_event")  # P is stamped (and holds the row); its COMMIT stalls
    assert w.emit(p, k) == PAUSED
    _pause(d, False)
    time.sleep(2.5)  # the stall: longer than commit_latency_seconds
    before_r()
    w.emit(r, k), r.finish()  # R's event leaves the busy row out
    w.loop(s), s.finish()  # run 2: Q's and R's events; the row P holds is skipped
    assert p.resume() == DONE
    p.finish()
    ids = dict(zip(("first", "second", "late", "third"), _events(w)))
    assert _consumed(d) == [[ids["first"]], [ids["second"], ids["third"]]]
    return d, ids, s


def _jump_event_ids(by: int) -> None:
    """The next event id ``by`` past the last allocated (a sequence set ahead, an auto-increment bumped)."""
    from airflow import settings
    from sqlalchemy import text

    with settings.engine.connect() as conn:
        if BACKEND == "postgres":  # setval is not transactional
            conn.execute(
                text("SELECT setval('dataset_event_id_seq', nextval('dataset_event_id_seq') + :by)"),
                {"by": by},
            )
            conn.commit()
        else:  # InnoDB's counter is not transactional either: an explicit id rolled back still moves it
            dataset_id = conn.scalar(text("SELECT min(id) FROM dataset"))
            top = conn.scalar(text("SELECT max(id) FROM dataset_event")) + 2 * by
            conn.execute(
                text(
                    "INSERT INTO dataset_event (id, dataset_id, timestamp, extra) "
                    "VALUES (:id, :d, now(), '{}')"
                ),
                {"id": top, "d": dataset_id},
            )
            conn.rollback()


@servers_only
def test_a_jump_in_the_event_ids_does_not_blind_the_net(world, monkeypatch):
    """
    The net reads the new ids from the lowest above the highest seen (``min()``), 5 000 at most: a
    jump of 20 000 in the ids between P's INSERT and R's (a sequence set ahead, an auto-increment
    bumped) must neither stop it at the jump nor hide P's late commit below it.
    """
    monkeypatch.setenv(LATENCY, "1")
    w = world
    d, ids, s = commit_late_after_a_run(w, quiet=True, before_r=lambda: _jump_event_ids(20_000))
    assert ids["third"] - ids["late"] > 20_000
    time.sleep(0.5)
    for _ in range(3):  # a look a loop: P's id, then R's beyond the jump
        w.loop(s), s.finish()
        time.sleep(0.5)
    assert ids["late"] in sum(_consumed(d), []), "P's late commit below the jump was not consumed"
    assert s.runner.__dict__["_dataset_race_fix_net"].high >= ids["third"], "the net stopped at the jump"
    q = w.producer("Q3")
    w.emit(q, w.dataset("k")), q.finish()
    w.drain(s, start=None)
    assert sorted(sum(_consumed(d), [])) == sorted(_events(w))
    assert w.report().violations() == {}


@servers_only
@pytest.mark.parametrize("then", ["the same scheduler", "a restarted scheduler"])
@pytest.mark.parametrize("row", ["no queue row", "another event moves the row past it"])
def test_a_late_commit_below_the_latest_run_is_consumed_within_a_few_loops(world, monkeypatch, then, row):
    """
    The same scheduler follows the event ids: P's id appears (a gap filled) stamped more than the
    latency before the clock, so its next loop finds and consumes it. A restarted one reads each
    reference's window once, the DAGs with the oldest latest run first. On the code before issue 47
    (a net reading every window once per full_read_interval_seconds, 300 s) neither took it here.
    """
    monkeypatch.setenv(LATENCY, "1")
    w = world
    d, ids, s = commit_late_after_a_run(w, quiet=row == "no queue row")
    if row != "no queue row":
        q2 = w.producer("Q2")
        (
            w.emit(q2, w.dataset("k")),
            q2.finish(),
        )  # moves the row past P's stamp: no row pulls the floor down to it
    scheduler = s if then == "the same scheduler" else w.scheduler("restarted")
    time.sleep(0.5)  # the net looks at the ids at most every half second
    # a restarted one's window pass takes 3 % of the time: its loops 0.1 s apart,
    # as an idle scheduler's are further
    loops, most = 0, 1 if then == "the same scheduler" else 40
    while ids["late"] not in sum(_consumed(d), []) and loops < most:
        w.loop(scheduler), scheduler.finish()
        loops += 1
        time.sleep(0 if then == "the same scheduler" else 0.1)
    assert ids["late"] in sum(_consumed(d), []), f"not consumed after {loops} loops"
    w.drain(scheduler, start=None)
    assert sorted(sum(_consumed(d), [])) == sorted(ids.values()) + (
        [] if row == "no queue row" else [max(_events(w))]
    )
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
    w.drain(s, start=7 if BACKEND == "sqlite" else None)
    assert _consumed(d) == [[first], [stepped], [pending]]
    assert _db_now() is not None and w.report().violations() == {}


def test_a_database_clock_stepped_forward_then_back_loses_nothing_stock_consumes(world, monkeypatch):
    """
    Issue 47 item 5: E1 and run 1; the database clock jumps 20 minutes ahead: E2 and run 2, dated
    there; the clock is corrected and the DAG paused; E3 is registered (no queue row: paused); the
    DAG is unpaused 16 minutes later and E4 follows. Stock makes a run of {E3, E4} (its window starts
    at the run before its date: run 1). The fix read from the clock less the look-back (15 min), above
    E3, and never consumed it; it now reads, while its latest run is ahead of the clock, from the run
    before the clock, as stock does.
    """
    from test_commit_stamps import _move_server_clock, _pause, first_run_before_a_clock_step

    w = world
    a, d, p, s, at = first_run_before_a_clock_step(w)  # E1, run 1
    if BACKEND == "sqlite":
        at(1200 + 3)
    else:
        _move_server_clock(monkeypatch, 1200)
    w.emit(p, a), p.finish()  # E2, 20 minutes ahead
    at(1200 + 4), w.loop(s), s.finish()  # run 2, dated there
    if BACKEND == "sqlite":
        at(5)
    else:
        monkeypatch.undo()
    _pause(d, True)
    w.emit(p, a), p.finish()  # E3: no queue row
    if BACKEND == "sqlite":
        at(960 + 5)
    else:
        _move_server_clock(monkeypatch, 960)  # the DAG waits 16 minutes
    _pause(d, False)
    w.emit(p, a), p.finish()  # E4
    at(960 + 6), w.loop(s), s.finish()
    e1, e2, e3, e4 = _events(w)
    assert _consumed(d) == [[e1], [e2], [e3, e4]]
    assert w.report().violations() == {}


@pytest.mark.parametrize("with_events", [False, True], ids=["dag_run", "dag_run-and-dataset_event"])
@pytest.mark.parametrize("then", ["the same scheduler", "a restarted scheduler"])
def test_db_clean_of_runs_makes_nothing_be_consumed_again(world, monkeypatch, then, with_events):
    """
    Issue 47 item 4: three runs of one event each; ``airflow db clean`` of ``dag_run`` (Airflow's own
    cleanup, which keeps each DAG's run started last: here the latest, each run started at its logical
    date; an older run kept: ``test_time_and_deletion.py``), with or without ``dataset_event``. Stock creates
    nothing; the fix's net read the cleaned runs' events as never consumed and ran them again. Nothing
    may be consumed again by the same or a restarted scheduler; a new event makes a run of itself.
    """
    from airflow.utils.db_cleanup import run_cleanup

    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__REQUEUE_INTERVAL_SECONDS", "0")
    # events of cleaned runs within commit_latency_seconds of the kept run's newest come back (BUG_REPORT,
    # "Deleted runs"): 1 s here, and the runs 1.1 s apart
    monkeypatch.setenv(LATENCY, "1")
    w = world
    a = w.dataset("a")
    d = w.consumer("d", [a])
    p, s = w.producer("P"), w.scheduler()
    w.clock.stop()
    for _ in range(3):
        w.emit(p, a), p.finish()
        w.loop(s), s.finish()
        time.sleep(1.1)
    assert [len(run) for run in _consumed(d)] == [1, 1, 1]
    with create_session() as session:  # db clean dates runs by their start: they ran
        session.execute(
            update(DagRun).where(DagRun.dag_id == d).values(start_date=DagRun.execution_date, state="success")
        )
        newest = session.scalar(select(func.max(DagRun.execution_date)).where(DagRun.dag_id == d))
    tables = ["dag_run", "dataset_event"] if with_events else ["dag_run"]
    run_cleanup(
        clean_before_timestamp=newest, table_names=tables, dry_run=False, confirm=False, skip_archive=True
    )
    assert len(_consumed(d)) == 1  # the latest run is kept
    scheduler = s if then == "the same scheduler" else w.scheduler("restarted")
    for _ in range(5):
        w.loop(scheduler), scheduler.finish()
    assert len(_consumed(d)) == 1, "cleaned runs' events consumed again"
    (
        w.emit(p, a),
        p.finish(),
    )  # its queue row reads from commit_latency_seconds before it: not below the oldest run
    w.loop(scheduler), scheduler.finish()
    assert _consumed(d)[-1] == [max(_events(w))]


def test_a_restarted_scheduler_finds_a_quiet_dags_late_commit_first(world, monkeypatch):
    """
    A late commit that committed while no scheduler ran (no process saw its id appear), on a
    quiet DAG, beside a busy DAG with 40 000 consumed events committed after it. A restarted
    scheduler reads on from the last scheduler's mark: the ids since appear to it in id order,
    and it probes its late events from both ends of its queue: the quiet DAG's within its first
    two seconds (loops 0.1 s apart), whatever the busy one's events.
    """
    from datetime import timedelta

    from airflow.models.dataset import association_table
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType
    from sqlalchemy import insert

    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__REQUEUE_INTERVAL_SECONDS", "0")
    w = world
    a, b = w.dataset("a"), w.dataset("b")
    busy, quiet = w.consumer("a_busy", [a]), w.consumer("z_quiet", [b])
    p, s = w.producer("P"), w.scheduler()
    w.clock.stop()
    from test_net_findings import caught_up

    caught_up(
        w, s
    )  # its mark then lies at the newest id: what is inserted below commits while no scheduler runs
    for _ in range(2):  # the quiet DAG's two runs
        w.emit(p, b), p.finish()
        w.loop(s), s.finish()
    (first, second), (run1, run2) = _events(w), _consumed(quiet)
    from airflow.datasets.manager import DatasetManager

    with create_session() as session:
        dates = list(
            session.scalars(
                select(DagRun.execution_date).where(DagRun.dag_id == quiet).order_by(DagRun.execution_date)
            )
        )
        b_id, a_id = (
            session.scalar(select(DatasetModel.id).where(DatasetModel.uri == ds.uri)) for ds in (b, a)
        )
        # the late commit: stamped between the two runs, committed after the second, while no scheduler ran
        stranded = DatasetEvent(dataset_id=b_id, timestamp=dates[0] + (dates[1] - dates[0]) / 2)
        session.add(stranded)
        session.flush()
        late = stranded.id
        # the busy DAG: 40 000 events over the last 800 s, all consumed by its latest run,
        # dated now (after an older run)
        now = DatasetManager._database_now(session)
        session.execute(
            insert(DatasetEvent),
            [
                {
                    "dataset_id": a_id,
                    "timestamp": now - timedelta(seconds=800) * (40_000 - i) / 40_000,
                    "extra": {},
                }
                for i in range(40_000)
            ],
        )
        runs = [
            DagRun(
                dag_id=busy,
                run_id=f"dataset_triggered__busy{i}",
                execution_date=now - timedelta(seconds=900 * i),
                state=DagRunState.SUCCESS,
                run_type=DagRunType.DATASET_TRIGGERED,
                external_trigger=False,
            )
            for i in (1, 0)
        ]
        session.add_all(runs)
        session.flush()
        session.execute(
            insert(association_table).from_select(
                ["dag_run_id", "event_id"],
                select(runs[1].id, DatasetEvent.id).where(DatasetEvent.dataset_id == a_id),
            )
        )
    restarted, loops = w.scheduler("restarted"), 0
    while late not in sum(_consumed(quiet), []) and loops < 20:
        w.loop(restarted), restarted.finish()
        loops += 1
        time.sleep(0.1)
    assert _consumed(quiet)[2:] == [[late]], f"not consumed in {loops} loops of a restarted scheduler"
    assert (run1, run2) == ([first], [second])
