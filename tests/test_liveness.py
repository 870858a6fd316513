"""
Liveness: nothing the fix keeps waiting holds up another DAG or another producer (issues
"No DAG starves..." item 1 and "One stalled producer must not hold up the other
producers of its dataset"). Each test drives its interleaving step by step on a real
database:

- DAGs whose events are dated ahead (a stock producer's host clock, during an upgrade),
  more of them than ``max_dagruns_to_create_per_loop``, take no slot from a DAG that can
  run: its run comes in the first or second loop, stock and fixed alike; their own events
  are consumed once the clock gets there (the sweep);
- a producer frozen after its queue upsert, just before its COMMIT, holds up neither
  another producer of the same dataset and DAG (it leaves the row, after
  ``queue_row_wait_seconds`` if set) nor one of another dataset, and nothing is lost or doubled
  whether the frozen one then commits or rolls back.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from airflow.models.dag import DagModel
from airflow.models.dagrun import DagRun
from airflow.models.dataset import DatasetDagRunQueue, DatasetEvent, DatasetModel
from airflow.utils.session import create_session
from conftest import BACKEND
from sqlalchemy import func, select

from reproduce.harness.faults import run_producer
from reproduce.harness.world import BLOCKED, DONE, PAUSED, Aborted, World

servers_only = pytest.mark.skipif(BACKEND == "sqlite", reason="needs two open writers (SQLite has one)")


def _world(request) -> World:
    return World(request.node.name[5:25])


@pytest.fixture
def world(request, variant_fixed):
    w = _world(request)
    yield w
    w.close()


@pytest.fixture
def world_stock_or_fixed(request, variant):
    w = _world(request)
    yield w
    w.close()


def _runs(dag_id: str) -> list[tuple[object, list[int]]]:
    """(logical date, consumed event ids) per run, in creation order."""
    with create_session() as session:
        return [
            (r.execution_date, sorted(e.id for e in r.consumed_dataset_events))
            for r in session.scalars(select(DagRun).where(DagRun.dag_id == dag_id).order_by(DagRun.id))
        ]


def _queued(dag_id: str) -> int:
    with create_session() as session:
        return session.scalar(
            select(func.count())
            .select_from(DatasetDagRunQueue)
            .where(DatasetDagRunQueue.target_dag_id == dag_id)
        )


def _event_ids(uri: str) -> list[int]:
    with create_session() as session:
        return list(
            session.scalars(
                select(DatasetEvent.id)
                .join(DatasetModel, DatasetModel.id == DatasetEvent.dataset_id)
                .where(DatasetModel.uri == uri)
                .order_by(DatasetEvent.id)
            )
        )


def _db_now():
    from airflow.datasets.manager import DatasetManager

    with create_session() as session:
        return DatasetManager._database_now(session)


def _shift_server_clock(monkeypatch, seconds: int) -> None:
    """The fix's reads of the server's clock ``seconds`` ahead (SQLite's clock is the host's: move that)."""
    from airflow.datasets.manager import DatasetManager

    shifted = {
        "postgres": f"(clock_timestamp() + interval '{seconds} seconds')",
        "mysql": f"(NOW(6) + INTERVAL {seconds} SECOND)",
    }
    monkeypatch.setattr(DatasetManager, "_database_clock", classmethod(lambda cls, name: shifted[BACKEND]))


@pytest.mark.parametrize("victim_kind", ["cron", "dataset"])
def test_dags_kept_waiting_take_no_slot_from_a_dag_that_can_run(
    world_stock_or_fixed, variant, victim_kind, monkeypatch
):
    """
    Twelve consumers of one event and its queue rows, dated 600 s ahead as a stock producer
    on a host clock ten minutes ahead writes them; then a victim becomes due. Stock and
    fixed: the victim runs in loop 1 or 2 (the fix kept the rows of deferred events, so the
    twelve DAGs took every slot in every loop: never, on MariaDB and PostgreSQL).
    """
    w = world_stock_or_fixed
    slots = DagModel.NUM_DAGS_PER_DAGRUN_QUERY
    a, v = w.dataset("a"), w.dataset("v")
    w.clock.at(0)  # SQLite: the DAGs are scheduled on their datasets before the events
    waiting = [w.consumer(f"w{i:02d}", [a]) for i in range(slots + 2)]
    victim = w.consumer("victim", timedelta(hours=1) if victim_kind == "cron" else [v])
    p, s = w.producer("P"), w.scheduler()
    if BACKEND == "sqlite":  # the host's clock is the database's: a producer ten minutes ahead
        w.clock.at(600), w.emit(p, a), p.finish()
        w.clock.at(0)
    else:
        w.clock.stop()
        run_producer(a.uri, fixed=False, clock_offset=600)
    assert [_queued(dag_id) for dag_id in waiting] == [1] * len(waiting)
    if victim_kind == "dataset":
        w.emit(p, v), p.finish()
    for _ in range(2):
        w.loop(s), s.finish()
    assert _runs(victim), "the victim had no run in 2 loops"
    if variant == "stock":
        return
    # Fixed: nothing dated ahead of the database's clock; the twelve runs wait for the clock.
    assert all(not _runs(dag_id) for dag_id in waiting)
    assert all(_queued(dag_id) == 0 for dag_id in waiting)  # their rows went: they hold no slot
    if BACKEND == "sqlite":
        w.clock.at(700)
    else:
        _shift_server_clock(monkeypatch, 660)
    for _ in range(3):  # the sweep: at most max_dagruns_to_create_per_loop DAGs a loop
        w.finish_runs()
        w.loop(s), s.finish()
    assert [len(_runs(dag_id)) for dag_id in waiting] == [1] * len(waiting)
    assert w.report().violations() == {}


@servers_only
@pytest.mark.parametrize("outcome", ["commit", "rollback"])
@pytest.mark.parametrize("wait", [0, 0.2], ids=["no-wait", "wait-0.2s"])
def test_a_producer_frozen_before_its_commit_holds_up_no_other_producer(world, outcome, wait, monkeypatch):
    """
    A registers an event on ``a`` and freezes after its queue upsert and its stamp, just
    before its COMMIT, holding the (a, X) row. B produces on ``a`` for the same DAG three
    times, C on ``c`` for another: each transaction ends within the bound (the fix used to
    hold B for A's whole stall: 39.7 s on PostgreSQL, a lock wait timeout on MariaDB) and
    none fails. Then A commits, or rolls back: every committed event is consumed once, and
    nothing is left queued for A's rolled back event. With ``queue_row_wait_seconds`` at
    its default (0) and at 0.2 s (B polls that long, then leaves the row).
    """
    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__QUEUE_ROW_WAIT_SECONDS", str(wait))
    w = world
    a, c = w.dataset("a"), w.dataset("c")
    x, z = w.consumer("x", [a]), w.consumer("z", [c])
    p0, frozen, b_producer, c_producer, s = (
        w.producer("P0"),
        w.producer("A"),
        w.producer("B"),
        w.producer("C"),
        w.scheduler(),
    )
    w.emit(p0, a), p0.finish()  # the (a, X) and (c, Z) rows exist: a row stock never waited for
    w.emit(p0, c), p0.finish()
    frozen.pause_after("update dataset_event")  # the stamp: its last statement before COMMIT
    assert w.emit(frozen, a) == PAUSED
    slowest = {"B": 0.0, "C": 0.0}
    for _ in range(3):
        for name, producer, dataset in (("B", b_producer, a), ("C", c_producer, c)):
            started = time.monotonic()
            # (MariaDB's monitor may show a SKIP LOCKED read in LOCK WAIT for an instant: the
            # time taken is what counts)
            assert w.emit(producer, dataset) in (DONE, BLOCKED)
            producer.finish()  # raises if its transaction failed
            slowest[name] = max(slowest[name], time.monotonic() - started)
    # A's freeze lasts until the test resumes it: any wait for it would show as the step's timeout
    assert wait <= slowest["B"] < wait + 2.0, slowest
    assert slowest["C"] < 2.0, slowest
    assert w.loop(s) == DONE  # while A is frozen: X and Z run on what committed
    s.finish()
    assert len(_runs(x)) == 1 and len(_runs(z)) == 1
    if outcome == "commit":
        assert frozen.resume() == DONE
        frozen.finish()
    else:
        assert frozen.abort() == DONE
        with pytest.raises(Aborted):
            frozen.finish()
    w.drain(s, start=None)
    consumed = [event_id for dag_id in (x, z) for _, ids in _runs(dag_id) for event_id in ids]
    assert sorted(consumed) == sorted(_event_ids(a.uri) + _event_ids(c.uri))  # each once
    assert len(_event_ids(a.uri)) == (5 if outcome == "commit" else 4)
    assert _queued(x) == 0 and _queued(z) == 0  # nothing left queued (A's rolled back event has none)
    assert w.report().violations() == {}


@pytest.mark.parametrize("held_by", ["max_active_runs", "paused"])
def test_dags_that_cannot_run_take_no_place_from_a_swept_dag(world, held_by, monkeypatch):
    """
    Issue 47 item 3: more DAGs than twice ``max_dagruns_to_create_per_loop``, each with an event
    older than the victim's that no queue row brings in, held at ``max_active_runs`` (then
    paused); the victim's event has no queue row either. The sweep must pick the victim in its
    first loop: it kept the oldest candidates before dropping those that cannot run, so the
    victim waited until the held DAGs' runs ended.
    """
    from sqlalchemy import delete, update

    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__REQUEUE_INTERVAL_SECONDS", "0")  # a sweep every loop
    w = world
    slots = DagModel.NUM_DAGS_PER_DAGRUN_QUERY
    a, v = w.dataset("a"), w.dataset("v")
    held = [w.consumer(f"h{i:02d}", [a], max_active_runs=1) for i in range(2 * slots + 1)]
    victim = w.consumer("victim", [v])
    p, s = w.producer("P"), w.scheduler()
    w.clock.stop()
    w.emit(p, a), p.finish()
    for _ in range(4):  # a run each (max_dagruns_to_create_per_loop a loop), left running
        w.loop(s), s.finish()
    assert all(len(_runs(dag_id)) == 1 for dag_id in held)
    w.emit(p, a), p.finish()  # a second event for each held DAG ...
    w.emit(p, v), p.finish()  # ... older than the victim's
    with create_session() as session:  # neither is brought in by a queue row: the sweep's case
        session.execute(
            delete(DatasetDagRunQueue).where(DatasetDagRunQueue.target_dag_id.in_([*held, victim]))
        )
        if held_by == "paused":
            session.execute(update(DagModel).where(DagModel.dag_id.in_(held)).values(is_paused=True))
    w.loop(s), s.finish()
    assert [events for _, events in _runs(victim)] == [_event_ids(v.uri)], (
        "the victim waited behind DAGs that cannot run"
    )


def test_a_paced_sweep_round_reaches_its_last_page(world, monkeypatch):
    """
    The sweep reads a page of its round where the net looks (quiet: every other look), paced by its credit
    and sized to 1-2 ms, the round's DAGs read once at its start. 23 DAGs on one dataset with
    pages of 5: the last one's event, with no queue row, is not found by the round's first page
    but by a later one, within the round (a round that stopped at its first page, or lost its
    place, never finds it); nothing else is consumed.
    """
    from sqlalchemy import delete

    monkeypatch.setenv(
        "AIRFLOW__DATASET_RACE_FIX__REQUEUE_INTERVAL_SECONDS", "0.001"
    )  # paced, not every loop
    # a look every loop: a page with every look, nine loops after the last while the net is quiet
    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__NET_LOOK_INTERVAL_SECONDS", "0")
    w = world
    a, v = w.dataset("a"), w.dataset("v")
    w.consumers("a", [a], 22)
    victim = w.consumer("zz_victim", [a, v])  # last in dag_id order; its condition: both datasets
    p, s = w.producer("P"), w.scheduler()
    w.clock.stop()
    w.emit(p, v), p.finish()
    w.loop(s), s.finish()  # the first loop: no round yet (one interval after the start)
    w.emit(p, a), p.finish()
    with create_session() as session:  # no queue row brings in any of them: the sweep's case
        session.execute(delete(DatasetDagRunQueue).where(DatasetDagRunQueue.target_dag_id.in_(w.dag_ids)))
    sweep = s.runner.__dict__["_dataset_race_fix_sweep"]
    sweep.at, sweep.size, sweep.credit = float("-inf"), 5, 0.0
    w.loop(s), s.finish()
    assert _runs(victim) == [] and 0 < len(sweep.todo) <= 18, "the first page was not a page of 5"
    loops = 1
    while not _runs(victim) and loops < 60:
        time.sleep(0.05)  # (the credit earns 3 % of this)
        w.loop(s), s.finish()
        loops += 1
    assert [events for _, events in _runs(victim)] == [sorted(_event_ids(a.uri) + _event_ids(v.uri))], loops
    # DAGs a page found past max_dagruns_to_create_per_loop wait for the next round: a few loops more
    while any(not _runs(dag_id) for dag_id in w.dag_ids) and loops < 120:
        time.sleep(0.05)
        w.loop(s), s.finish()
        loops += 1
    runs = {dag_id: len(_runs(dag_id)) for dag_id in w.dag_ids}
    assert set(runs.values()) == {1}, f"each DAG consumes its event once: {runs}"


@pytest.mark.parametrize("change", ["event read", "dated ahead", "unpaused", "30 intervals"])
def test_an_idle_sweep_round_reads_no_dag_and_each_change_is_read(world, change, monkeypatch):
    """
    A sweep round reads every DAG only where something may have changed since the last began; idle, only
    the DAGs new since (at a loop a second an idle round's pages cost a loop in three). What each change
    leaves with no queue row is consumed once: an event the net read, its row gone ('event read'); one
    dated ahead, once the clock gets there with no other event ('dated ahead'); a DAG unpaused after its
    event ('unpaused'); a row deleted where nothing signals it, as a stock scheduler's delete in a mixed
    state, at the round that reads every DAG at least every 30 intervals ('30 intervals').
    """
    from sqlalchemy import delete, update

    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__REQUEUE_INTERVAL_SECONDS", "5")  # rounds forced below
    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__NET_LOOK_INTERVAL_SECONDS", "0")  # a look every loop
    w = world
    a = w.dataset("a")
    now = [0]

    def tick(to: int | None = None) -> None:  # SQLite's clock is the host's: each step a second later
        now[0] = now[0] + 1 if to is None else to
        w.clock.at(now[0])

    tick()  # the DAG is scheduled on its dataset before the events
    x = w.consumer("x", [a])
    p, s = w.producer("P"), w.scheduler()

    def set_dag(**values) -> None:
        with create_session() as session:
            session.execute(update(DagModel).where(DagModel.dag_id == x).values(**values))

    def delete_row() -> None:
        with create_session() as session:
            session.execute(delete(DatasetDagRunQueue).where(DatasetDagRunQueue.target_dag_id == x))

    def sweep_round() -> bool:
        """A loop whose sweep starts a round (due, credit allowing; 3 DAGs: one page): whether it was full."""
        sweep = s.runner.__dict__["_dataset_race_fix_sweep"]
        sweep.at, sweep.credit, sweep.loops = float("-inf"), 0.0, 20
        tick(), w.loop(s), s.finish()
        return sweep.full

    tick(), w.emit(p, a), p.finish()
    tick(), w.loop(s), s.finish()  # x consumes the first event by its row
    w.finish_runs()
    assert sweep_round() is True, "a process's first round reads every DAG"
    clock_read = s.runner.__dict__["_dataset_race_fix_sweep"].now
    assert sweep_round() is False, "nothing changed: only the DAGs new since"
    assert s.runner.__dict__["_dataset_race_fix_sweep"].dag_ids == {x}
    assert s.runner.__dict__["_dataset_race_fix_sweep"].now == clock_read, "an idle round reads no clock"
    if change == "event read":
        tick(), w.emit(p, a), p.finish()
        delete_row()
        assert sweep_round() is True
    elif change == "dated ahead":
        if BACKEND == "sqlite":  # the host's clock is the database's: a producer ten minutes ahead
            tick(600), w.emit(p, a), p.finish()
            tick(10)
        else:
            run_producer(a.uri, fixed=False, clock_offset=600)
        tick(), w.loop(s), s.finish()  # its row deleted as read: the event waits for the clock
        assert sweep_round() is True and len(_runs(x)) == 1
        assert sweep_round() is True, "an event dated past the last round's horizon: every DAG again"
        if BACKEND == "sqlite":
            tick(700)
        else:
            _shift_server_clock(monkeypatch, 660)
        assert sweep_round() is True
    elif change == "unpaused":
        set_dag(is_paused=True)
        tick(), w.emit(p, a), p.finish()  # no row for a paused DAG
        assert sweep_round() is True and len(_runs(x)) == 1  # the event read: every DAG, x paused
        set_dag(is_paused=False)
        assert sweep_round() is False, "only x, new since the last round"
    else:
        set_dag(has_import_errors=True)  # its row stays: no loop decides it
        tick(), w.emit(p, a), p.finish()
        assert sweep_round() is True and _queued(x) == 1
        set_dag(has_import_errors=False)
        delete_row()
        assert sweep_round() is False and len(_runs(x)) == 1, "nothing signals a row deleted"
        s.runner.__dict__["_dataset_race_fix_sweep"].full_at -= 30 * 5
        assert sweep_round() is True
    assert [events for _, events in _runs(x)] == [[i] for i in _event_ids(a.uri)]
    assert w.report().violations() == {}


def _late_event_below_their_runs(w: World, s, datasets: list, dag_ids: list[str]) -> int:
    """
    Two runs each for ``dag_ids`` (scheduled on ``datasets``), then P's event on the first, ``k``,
    stamped before their latest runs and committed after them, while they are paused (no queue row).
    Servers: P is stamped and stalls before its COMMIT past ``commit_latency_seconds`` (1 s: the
    caller sets it). SQLite (one writer: no COMMIT stalls while others commit): the host's clock
    stepped back 10 s for P's event, the only way a stamp lands there. Returns P's event id.
    """
    from test_commit_stamps import _pause

    q, p, r = w.producer("Q"), w.producer("P"), w.producer("R")

    def at(seconds: float) -> None:
        if BACKEND == "sqlite":
            w.clock.at(seconds)

    def runs_for_all(count: int, start: float) -> None:
        for loop in range(len(dag_ids)):  # max_dagruns_to_create_per_loop a loop
            at(start + loop), w.loop(s), s.finish()
        assert [len(_runs(dag_id)) for dag_id in dag_ids] == [count] * len(dag_ids)

    def paused(paused: bool) -> None:
        for dag_id in dag_ids:
            _pause(dag_id, paused)

    k = datasets[0]
    for dataset in datasets:
        at(1), w.emit(q, dataset), q.finish()
    runs_for_all(1, 3)
    if BACKEND == "sqlite":
        at(10), w.emit(r, k), r.finish()
        for dataset in datasets[1:]:
            at(20), w.emit(r, dataset), r.finish()
        runs_for_all(2, 21)  # dated at 20
        paused(True)
        at(15), w.emit(p, k), p.finish()  # stamped at 15: above k's newest, below the runs
        paused(False)
    else:
        paused(True)
        p.pause_after("update dataset_event")  # P is stamped; its COMMIT stalls
        assert w.emit(p, k) == PAUSED
        paused(False)
        time.sleep(1.5)  # longer than commit_latency_seconds
        for dataset in datasets:
            w.emit(r, dataset), r.finish()
        runs_for_all(2, 0)  # above P's stamp; P's event is invisible to them
        assert p.resume() == DONE
        p.finish()
    (late,) = set(_event_ids(k.uri)) - {e for dag_id in dag_ids for _, ids in _runs(dag_id) for e in ids}
    return late


def _emit_without_waiting(w: World, producer, dataset) -> None:
    """``producer`` registers an event on ``dataset`` and commits, waiting for nobody (2 s at most)."""
    started = time.monotonic()
    # (MariaDB's monitor may show a SKIP LOCKED read in LOCK WAIT for an instant: the time counts)
    assert w.emit(producer, dataset) in (DONE, BLOCKED)
    producer.finish()  # raises if its transaction failed
    assert time.monotonic() - started < 2.0, f"{producer.name} waited {time.monotonic() - started:.1f}s"


def test_dags_waiting_with_findings_take_no_slot_and_hold_up_no_producer(world, monkeypatch):
    """
    Issue 57: four AND DAGs (``k and m``), more than ``max_dagruns_to_create_per_loop`` (2
    here), hold the net's findings of a late event on ``k`` (stamped before their latest runs,
    committed after), their condition unmet; ``zz`` (last in dag_id order) holds a
    finding of the same event, its condition met (``zz``: ``k or n``); ``o`` (on ``v``) gets an
    event. Servers: F registers on ``m`` (the AND DAGs' partner) and freezes before its COMMIT.

    The next loop runs ``o`` and ``zz`` (its late event in it): the waiting DAGs, ordered before
    it, take no slot. No producer waits, while the net's finding INSERT is uncommitted, nor the
    loop's DELETE of ``zz``'s finding, nor while F is frozen. The four findings stay in the log
    table for two loops; once F commits, each AND DAG's run consumes its late event, and its
    finding goes with it. SQLite: no frozen producer and no paused loop (its one writer makes
    every other writer wait, stock and fixed alike); the late event from a clock stepped back.
    """
    from test_net_findings import _findings, caught_up

    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__COMMIT_LATENCY_SECONDS", "1")
    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__NET_LOOK_INTERVAL_SECONDS", "0")  # a look every loop
    monkeypatch.setattr(DagModel, "NUM_DAGS_PER_DAGRUN_QUERY", 2)  # max_dagruns_to_create_per_loop
    w = world
    servers = BACKEND != "sqlite"
    k, m, n, v = w.dataset("k"), w.dataset("m"), w.dataset("n"), w.dataset("v")
    waiting = [w.consumer(f"and{i}", k & m) for i in range(4)]
    zz = w.consumer("zz", k | n)  # (not on m: F's new queue row would lock its DAG row, as stock's does)
    o = w.consumer("o", [v])
    frozen, b, c, f = w.producer("F"), w.producer("B"), w.producer("C"), w.producer("F2")
    s = w.scheduler()
    if servers:
        w.clock.stop()  # real time: the server's clock stamps everything
    else:
        w.clock.at(0)
    caught_up(w, s)
    late = _late_event_below_their_runs(w, s, [k, m, n], [*waiting, zz])
    if servers:
        frozen.pause_after("update dataset_event")  # stamped, holding its new (m, and*) rows: frozen
        assert w.emit(frozen, m) == PAUSED
    _emit_without_waiting(w, b, v)
    if servers:  # the net's finding INSERT, on its own connection, not committed yet
        s.pause_after("insert into log (")
        s.pause_after("delete from log ")  # the loop's DELETE of zz's finding, before its COMMIT
        assert w.loop(s) == PAUSED
        assert _findings(zz) == 0  # (not committed yet)
        _emit_without_waiting(w, c, v)
        _emit_without_waiting(w, c, k)
        assert s.resume() == PAUSED, "the loop deleted no finding: zz's finding brought no run"
        _emit_without_waiting(w, c, v)
        _emit_without_waiting(w, c, k)
        assert s.resume() == DONE
    else:
        w.clock.at(31), w.loop(s)
    s.finish()
    assert len(_runs(o)) == 1, "the DAG that can run had no run in the next loop"
    assert len(_runs(zz)) == 3, "zz's finding took no slot in the next loop"
    assert late in _runs(zz)[2][1], f"zz's late event {late} not in the run its finding brought: {_runs(zz)}"
    assert [_findings(dag_id) for dag_id in [*waiting, zz]] == [1, 1, 1, 1, 0]
    for second in (32, 33):  # the AND DAGs wait for m, their findings in the table
        w.finish_runs()
        if not servers:
            w.clock.at(second)
        w.loop(s), s.finish()
        assert [len(_runs(dag_id)) for dag_id in waiting] == [2] * 4
        assert [_findings(dag_id) for dag_id in waiting] == [1] * 4
    if servers:
        assert frozen.resume() == DONE
        frozen.finish()
    else:
        w.clock.at(34), w.emit(f, m), f.finish()
    w.drain(s, start=None if servers else 35)
    for dag_id in waiting:
        assert late in _runs(dag_id)[2][1], (
            f"{dag_id}: the late event {late} not in its next run: {_runs(dag_id)}"
        )
    events = {dag_id: _event_ids(k.uri) + _event_ids(m.uri) for dag_id in waiting}
    events[zz] = _event_ids(k.uri) + _event_ids(n.uri)
    events[o] = _event_ids(v.uri)
    for dag_id, ids in events.items():  # each event consumed once
        assert sorted(e for _, consumed in _runs(dag_id) for e in consumed) == sorted(ids), dag_id
    assert [_findings(dag_id) for dag_id in [*waiting, zz]] == [0] * 5
    assert w.report().violations() == {}


def _quiet_net(w: World, s):
    """
    Loops of ``s`` (the net looking every loop) until its net has caught up with the marks the
    tests before left, then one at which nothing appears and nothing waits: its net, quiet.
    """
    for _ in range(10):  # a new process reads on from the marks the tests before left
        w.loop(s), s.finish()
        net = s.runner.__dict__["_dataset_race_fix_net"]
        if not (net.late or net.below):
            break
    net.missing.clear()  # (ids the tests before rolled back: the session's database is shared)
    w.loop(s), s.finish()
    assert net.quiet, "nothing appeared and nothing waits, yet the net is not quiet"
    return net


def test_a_quiet_net_looks_ten_intervals_on_and_each_interval_while_ids_appear(world, monkeypatch):
    """
    The net's pace (docs/settings.md, ``net_look_interval_seconds``): after a look at which nothing
    appeared and nothing waits, the next comes ten intervals on (an idle scheduler's loop a second: a
    look every 5 s, so that its median stays stock's); a look that reads a new id is followed by the
    next one interval on. The last look's start is set back in each step, so no real time decides.
    """
    interval = "AIRFLOW__DATASET_RACE_FIX__NET_LOOK_INTERVAL_SECONDS"
    monkeypatch.setenv(interval, "0")  # a look every loop, until the net has caught up
    w = world
    if BACKEND == "sqlite":
        w.clock.at(0)
    a = w.dataset("a")
    w.consumer("x", [a])
    p, s = w.producer("P"), w.scheduler()
    net = _quiet_net(w, s)
    monkeypatch.setenv(interval, "1")

    def loop_after(seconds: float) -> bool:
        """A loop as if the last look began ``seconds`` ago: whether it looked."""
        net.looked_at = looked_at = time.monotonic() - seconds
        w.loop(s), s.finish()
        return net.looked_at != looked_at

    w.emit(p, a), p.finish()
    high = net.high
    assert not loop_after(9.5) and net.high == high, "a quiet net looked again within ten intervals"
    assert loop_after(10.5) and net.high > high, "ten intervals on, the quiet net did not look"
    assert not net.quiet, "a look that read a new id left the net quiet"
    assert not loop_after(0.5), "a look within an interval"
    assert loop_after(1.5), "after a look that read an id, the next did not come one interval on"
    assert net.quiet, "a look at which nothing appeared left the net busy"
    assert w.report().violations() == {}


def test_a_paced_sweep_page_comes_with_a_look_and_a_backstop_rounds_with_every_other_quiet_one(
    world, monkeypatch
):
    """
    Paced, the sweep reads a page in a loop where the net looks; in a backstop round (every DAG every 30
    intervals, nothing changed) while the net is quiet, with every other look only (nine loops or more
    after the last page), so that an idle loop a second pays a page in one loop of ten and a look in one
    of five; with no look, twenty loops after the last page. The last look's start and the credit are set
    in each step, so no real time decides.
    """
    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__REQUEUE_INTERVAL_SECONDS", "0.001")  # paced
    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__NET_LOOK_INTERVAL_SECONDS", "0")  # until caught up
    w = world
    if BACKEND == "sqlite":
        w.clock.at(0)
    else:
        w.clock.stop()  # real time: the server's clock stamps everything
    a = w.dataset("a")
    w.consumers("a", [a], 12)
    p, s = w.producer("P"), w.scheduler()
    net = _quiet_net(w, s)
    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__NET_LOOK_INTERVAL_SECONDS", "1")  # quiet: ten seconds
    sweep = s.runner.__dict__["_dataset_race_fix_sweep"]
    # a backstop round (every DAG for its 30 intervals alone: nothing changed), long (pages of one DAG)
    sweep.at, sweep.full_at, sweep.size, sweep.loops = float("-inf"), float("-inf"), 1, 20
    sweep.changes, sweep.found, sweep.todo = net.changes, False, []
    net.newest_stamp = None  # (events the tests before dated ahead would make every round a full one)
    sweep.dag_ids = sweep.dag_ids or frozenset()  # not the process's first round (a stopped clock: none yet)

    def page_read(look: bool) -> bool:
        """A loop whose net looks (its last look set 11 s back) or not (0.5 s): whether the sweep took a step.
        (Not "now": time-machine 2, the py39 pins', stops time.monotonic with SQLite's world clock.)"""
        net.looked_at = time.monotonic() - (11 if look else 0.5)
        sweep.credit, sweep.credit_at = 0.002, time.monotonic()
        w.loop(s), s.finish()
        return sweep.loops == 0

    assert page_read(look=True), "no page in a loop that looked, twenty loops after the last"
    assert net.quiet and sweep.todo and sweep.backstop, "the net is not quiet, or no backstop round is on"
    steps = [page_read(look=i % 5 == 4) for i in range(20)]  # a look in one loop of five
    assert [i for i, step in enumerate(steps) if step] == [9, 19], f"pages not with every other look: {steps}"
    steps = [page_read(look=False) for _ in range(20)]
    assert [i for i, step in enumerate(steps) if step] == [19], f"with no look, not twenty loops on: {steps}"
    for second in (10, 11):  # events appear: each look reads a new id, and the net is busy
        if BACKEND == "sqlite":
            w.clock.at(second)
        w.emit(p, a), p.finish()
        assert page_read(look=True) and not net.quiet, "no page with a look that read a new id"
    w.drain(s, start=12 if BACKEND == "sqlite" else None)
    assert w.report().violations() == {}
