"""
``explain``: its verdict is what the next scheduler loop really does, and it is read-only.

Every harness scenario (S1-S7) runs with each scheduler loop checked: just before the
loop, ``explain`` gives a verdict for every consumer DAG of the world; once the loop has
run (when it ran through without a pause), the DAGs that got a run, their events and
logical dates must be exactly those the verdicts named. More states are built below:
an AND condition waiting for one dataset, events dated ahead, a paused DAG, a DAG at
``max_active_runs``, a late commit.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from airflow import settings
from airflow.datasets import DatasetAll, DatasetAny
from airflow.models.dag import DagModel
from airflow.models.dagrun import DagRun
from airflow.models.dataset import DatasetDagRunQueue
from airflow.utils.session import create_session
from airflow.utils.types import DagRunType
from conftest import BACKEND
from sqlalchemy import delete, event, select, update

from airflow_dataset_race_fix.diagnostics.explain import ExplainError, explain
from reproduce.harness.scenarios import SCENARIOS
from reproduce.harness.world import DONE, PAUSED, World


def _runs(dag_id: str) -> dict[str, tuple]:
    """run_id -> (logical date, consumed event ids) of the DAG's dataset-triggered runs."""
    with create_session() as session:
        return {
            r.run_id: (r.execution_date, sorted(e.id for e in r.consumed_dataset_events))
            for r in session.scalars(
                select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_type == DagRunType.DATASET_TRIGGERED)
            )
        }


def _explain(dag_id: str) -> dict:
    with create_session() as session:
        try:
            return explain(session, dag_id)
        finally:
            session.rollback()


class LoopChecker:
    """Wraps ``World.loop``: explain every consumer first, compare with what the loop did."""

    def __init__(self, monkeypatch) -> None:
        self.checked = 0
        self.runs_predicted = 0
        original = World.loop

        def checked_loop(scheduler):
            world = scheduler.world
            verdicts = {dag_id: _explain(dag_id)["verdict"] for dag_id in world.dag_ids}
            before = {dag_id: _runs(dag_id) for dag_id in world.dag_ids}
            state = original(scheduler)
            if state == DONE and scheduler._step.error is None:
                for dag_id, verdict in verdicts.items():
                    new = {k: v for k, v in _runs(dag_id).items() if k not in before[dag_id]}
                    if verdict["when"] == "net" and not new:
                        pass  # the running scheduler's net has not read this DAG yet: a later loop
                    elif verdict["creates_run"]:
                        assert len(new) == 1, (dag_id, verdict, new)
                        ((date, event_ids),) = new.values()
                        assert event_ids == sorted(verdict["run"]["event_ids"]), (dag_id, verdict, new)
                        assert date.isoformat() == verdict["run"]["logical_date"], (dag_id, verdict, new)
                        self.runs_predicted += 1
                    else:
                        assert new == {}, f"{dag_id}: {json.dumps(verdict)}; the loop created {new}"
                    self.checked += 1
            return state

        monkeypatch.setattr(World, "loop", staticmethod(checked_loop))


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.id for s in SCENARIOS])
def test_the_verdict_is_what_the_next_loop_does_in_every_scenario(scenario, variant_fixed, monkeypatch):
    if not scenario.applies_to(BACKEND):
        pytest.skip(f"{scenario.id} cannot happen on {BACKEND}")
    checker = LoopChecker(monkeypatch)
    world = World(scenario.id)
    try:
        scenario.run(world)
        assert world.report().violations() == {}
    finally:
        world.close()
    # (a loop that pauses mid-way is not compared: a producer acts inside it)
    assert checker.checked > 0, checker.checked


@pytest.fixture
def world(variant_fixed, monkeypatch):
    checker = LoopChecker(monkeypatch)
    w = World("explain")
    w.checker = checker
    yield w
    w.close()


def test_an_and_condition_waiting_for_one_dataset(world):
    w = world
    a, b, c = w.dataset("a"), w.dataset("b"), w.dataset("c")
    d = w.consumer("d", DatasetAll(a, DatasetAny(b, c)))
    p, s = w.producer("P"), w.scheduler()
    w.clock.at(1), w.emit(p, a), p.finish()
    found = _explain(d)
    verdict = found["verdict"]
    assert not verdict["creates_run"] and verdict["run"] is None
    assert [r["code"] for r in verdict["reasons"]] == ["condition_not_met"]
    assert b.uri in verdict["reasons"][0]["message"] and c.uri in verdict["reasons"][0]["message"]
    assert found["condition"]["type"] == "all" and not found["condition"]["met"]
    assert [child["met"] for child in found["condition"]["children"]] == [True, False]
    (a_info,) = [ds for ds in found["datasets"] if ds["uri"] == a.uri]
    assert a_info["queue_row_created_at"] is not None and len(a_info["pending_event_ids"]) == 1
    assert w.loop(s) == DONE
    s.finish()
    w.clock.at(2), w.emit(p, c), p.finish()
    verdict = _explain(d)["verdict"]
    assert verdict["creates_run"] and verdict["when"] == "next loop" and len(verdict["run"]["event_ids"]) == 2
    assert w.loop(s) == DONE
    s.finish()
    assert w.checker.runs_predicted == 1
    assert {e["dataset_uri"] for e in _explain(d)["runs"][0]["events"]} == {a.uri, c.uri}


def test_paused_and_max_active_runs(world):
    w = world
    a = w.dataset("a")
    d = w.consumer("d", [a], max_active_runs=1)
    p, s = w.producer("P"), w.scheduler()
    w.clock.at(1), w.emit(p, a), p.finish()
    assert w.loop(s) == DONE  # run 1, still queued: max_active_runs reached
    s.finish()
    w.clock.at(2), w.emit(p, a), p.finish()
    verdict = _explain(d)["verdict"]
    assert not verdict["creates_run"] and "max_active_runs" in [r["code"] for r in verdict["reasons"]]
    assert w.loop(s) == DONE
    s.finish()
    w.finish_runs()
    with create_session() as session:
        session.execute(update(DagModel).where(DagModel.dag_id == d).values(is_paused=True))
    verdict = _explain(d)["verdict"]
    assert [r["code"] for r in verdict["reasons"]] == ["paused"] and verdict["run"] is not None
    with create_session() as session:
        session.execute(update(DagModel).where(DagModel.dag_id == d).values(is_paused=False))
    assert _explain(d)["verdict"]["creates_run"]
    assert w.loop(s) == DONE
    s.finish()
    assert w.checker.checked == 3 and w.checker.runs_predicted == 2


@pytest.mark.skipif(
    BACKEND == "sqlite", reason="an open producer transaction beside the scheduler: SQLite has one writer"
)
def test_a_late_commit(world):
    """
    S3: P's event commits after the run of a later event; explain names it for the next
    run, and flags it late there. (The (a, d) queue row exists, so P's COMMIT locks that
    row only: a new row would hold d's DAG row for its foreign key for those milliseconds,
    and the loop then skips d once; explain cannot see a row lock without taking one.)
    """
    w = world
    a, b = w.dataset("a"), w.dataset("b")
    d = w.consumer("d", DatasetAny(a, b))
    p, q, s = w.producer("P"), w.producer("Q"), w.scheduler()
    w.clock.stop()
    w.emit(q, a), q.finish()
    assert w.loop(s) == DONE  # run 1
    s.finish()
    w.emit(q, a), q.finish()
    p.pause_after("update dataset_event")
    assert w.emit(p, a) == PAUSED  # stamped, not committed
    w.emit(q, b), q.finish()
    assert w.loop(s) == DONE  # run 2: Q's events
    s.finish()
    assert p.resume() == DONE
    p.finish()
    found = _explain(d)
    assert found["verdict"]["creates_run"] and len(found["pending_events"]) == 1
    assert found["pending_events"][0]["dataset_uri"] == a.uri
    assert w.loop(s) == DONE  # run 3: P's late event
    s.finish()
    runs = _explain(d)["runs"]
    assert [e["late"] for e in runs[0]["events"]] == [True] and not any(e["late"] for e in runs[1]["events"])
    assert w.checker.runs_predicted == 3


@pytest.mark.skipif(
    BACKEND == "sqlite", reason="SQLite's clock is this host's: the servers' clock is moved instead"
)
def test_events_dated_ahead_wait(world, monkeypatch):
    from airflow.datasets.manager import DatasetManager

    w = world
    a = w.dataset("a")
    d = w.consumer("d", [a])
    p, s = w.producer("P"), w.scheduler()
    clock = {
        "postgres": "clock_timestamp() + interval '600 seconds'",
        "mysql": "NOW(6) + INTERVAL 600 SECOND",
    }[BACKEND]
    with monkeypatch.context() as ahead:
        ahead.setattr(DatasetManager, "_database_clock", classmethod(lambda cls, dialect_name: clock))
        w.emit(p, a), p.finish()  # dated 10 minutes ahead of the database's clock
    found = _explain(d)
    assert not found["verdict"]["creates_run"], found["verdict"]
    assert {r["code"] for r in found["verdict"]["reasons"]} >= {"deferred"}
    assert len(found["deferred_events"]) == 1
    assert w.loop(s) == DONE
    s.finish()


def test_bad_input(world):
    w = world
    a = w.dataset("a")
    d = w.consumer("consumer_of_a", [a])
    with pytest.raises(ExplainError, match="close matches: " + d):
        _explain(d[:-1] + "x")
    from datetime import datetime, timezone

    from airflow.models.dag import DAG
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.operators.empty import EmptyOperator

    cron = DAG(f"{w.prefix}_cron", schedule="@daily", start_date=datetime(2024, 1, 1, tzinfo=timezone.utc))
    EmptyOperator(task_id="t", dag=cron)
    with create_session() as session:
        DAG.bulk_write_to_db([cron], session=session)
        SerializedDagModel.write_dag(cron, session=session)
    with pytest.raises(ExplainError, match="not dataset-scheduled"):
        _explain(cron.dag_id)


def test_explain_writes_nothing_and_locks_nothing(world):
    w = world
    a, b = w.dataset("a"), w.dataset("b")
    d = w.consumer("d", DatasetAll(a, b))
    p = w.producer("P")
    w.emit(p, a), p.finish()
    sent: list[str] = []

    def record(conn, cursor, statement, *args):
        sent.append(" ".join(statement.split()).upper())

    event.listen(settings.engine, "before_cursor_execute", record)
    try:
        json.dumps(_explain(d))  # JSON-able as it is
    finally:
        event.remove(settings.engine, "before_cursor_execute", record)
    assert sent and all(
        s.startswith(("SELECT", "WITH", "PRAGMA", "SAVEPOINT", "RELEASE", "ROLLBACK")) for s in sent
    ), [s[:80] for s in sent if not s.startswith("SELECT")]
    assert not any("FOR UPDATE" in s or "FOR SHARE" in s for s in sent)


def _cli(*args: str, env: dict[str, str] | None = None):
    import os
    import subprocess
    import sys

    return subprocess.run(
        [
            sys.executable,
            "-m",
            "airflow_dataset_race_fix",
            "explain",
            *args,
            "--db-url",
            settings.SQL_ALCHEMY_CONN,
        ],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_text_says_whether_the_fix_is_active_and_names_what_each_finding_counts(world):
    """Issue 50: the fix's state in this process either way; the runs or events behind each count."""
    from airflow.models.dataset import DatasetEvent, DatasetModel
    from airflow.utils import timezone
    from airflow.utils.state import DagRunState

    from airflow_dataset_race_fix import BOOTSTRAP_DIR

    w = world
    a = w.dataset("a")
    d = w.consumer("d", [a])
    p, s = w.producer("P"), w.scheduler()
    w.emit(p, a), p.finish()
    w.loop(s), s.finish()
    # a stock S6 run (empty, inside the latest's interval), an event dated ahead
    with create_session() as session:
        latest = session.scalars(select(DagRun).where(DagRun.dag_id == d)).one()
        session.add(
            DagRun(
                dag_id=d,
                run_id="stock_overlap",
                run_type=DagRunType.DATASET_TRIGGERED,
                execution_date=latest.execution_date + timedelta(seconds=1),
                state=DagRunState.SUCCESS,
                data_interval=(latest.data_interval_start - timedelta(seconds=1), latest.data_interval_end),
            )
        )
        ahead = DatasetEvent(
            dataset_id=session.scalar(select(DatasetModel.id).where(DatasetModel.uri == a.uri)),
            timestamp=timezone.utcnow() + timedelta(days=1),
        )
        session.add(ahead)
        session.flush()
        ahead_id = ahead.id
    without, active = _cli(d), _cli(d, env={"PYTHONPATH": BOOTSTRAP_DIR})
    assert "the fix is not active in this process" in without.stdout, without.stdout + without.stderr[-2000:]
    assert "the fix is active in this process" in active.stdout, active.stdout + active.stderr[-2000:]
    expected = (
        f"Audit: empty_runs 1 (stock_overlap); future_dated 1 ({ahead_id}); "
        "overlapping_intervals 1 (stock_overlap)"
    )
    assert without.returncode == 1 and expected in without.stdout, without.stdout


def test_the_command_exit_codes_text_and_json(world):
    """0: nothing to report; 1: audit findings (an empty run); 2: bad input, one line. JSON parses."""
    from datetime import datetime, timezone

    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.state import DagRunState

    w = world
    a, b = w.dataset("a"), w.dataset("<script>alert(1)</script>")
    d = w.consumer("waiting", DatasetAll(a, b))
    p = w.producer("P")
    w.emit(p, a), p.finish()
    result = _cli(d)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "WAITS" in result.stdout and "condition_not_met" in result.stdout and b.uri in result.stdout
    result = _cli(d, "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    found = json.loads(result.stdout)
    assert (
        found["schema"] == "airflow-dataset-race-fix/explain/1" and found["verdict"]["creates_run"] is False
    )
    assert found["fix"]["active_in_this_process"] is False  # the child has no shim: loaded only to explain
    assert found["fix"]["seconds"] < 5

    with create_session() as session:  # an empty dataset-triggered run: audit's finding
        dag = SerializedDagModel.get_dag(d, session=session)
        dag.create_dagrun(
            run_id="dataset_triggered__empty",
            run_type=DagRunType.DATASET_TRIGGERED,
            execution_date=datetime(2025, 1, 1, tzinfo=timezone.utc),
            state=DagRunState.SUCCESS,
            external_trigger=False,
            session=session,
            data_interval=(datetime(2025, 1, 1, tzinfo=timezone.utc),) * 2,
        )
    result = _cli(d)
    assert result.returncode == 1 and "empty_runs 1" in result.stdout and "EMPTY" in result.stdout, (
        result.stdout
    )

    for args, expected in (((d + "x",), f"close matches: {d}"), ((d, "--runs", "-1"), "--runs")):
        result = _cli(*args)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2 and result.stdout == "", result.stderr[-2000:]
        assert lines[-1].startswith("airflow-dataset-race-fix explain: error: ") and expected in lines[-1], (
            lines
        )


def test_the_documented_json_keys_are_the_printed_keys(world):
    import re
    from pathlib import Path

    w = world
    a = w.dataset("a")
    d = w.consumer("d", [a])
    p = w.producer("P")
    w.emit(p, a), p.finish()
    doc = (Path(__file__).resolve().parents[1] / "docs" / "explain.md").read_text()

    def documented(section: str) -> set[str]:
        table = doc.split(f"<!-- keys: {section} -->", 1)[1].split("\n\n", 1)[0]
        return set(re.findall(r"^\| `([a-z_]+)` \|", table, re.M))

    found = _explain(d)
    found["fix"] = {}  # added by the command
    assert documented(".") == set(found)
    assert documented("verdict") == set(found["verdict"])


def test_without_the_fix_in_this_process_the_verdict_is_the_fixed_schedulers_and_nothing_is_patched(variant):
    """A webserver without the shim: explain still gives the fixed verdict, and patches nothing."""
    import airflow.utils.sqlalchemy as airflow_sqlalchemy
    from airflow.datasets.manager import DatasetManager
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner

    if variant == "fixed":
        pytest.skip("the fixed variant is covered by every other test here")
    w = World("explain_stock")
    try:
        a, b = w.dataset("a"), w.dataset("b")
        d = w.consumer("d", DatasetAll(a, b))
        p = w.producer("P")
        w.emit(p, a), p.finish()
        before = (
            dict(vars(SchedulerJobRunner)),
            dict(vars(DatasetManager)),
            airflow_sqlalchemy.USE_ROW_LEVEL_LOCKING,
        )
        verdict = _explain(d)["verdict"]
        assert [r["code"] for r in verdict["reasons"]] == ["condition_not_met"] and b.uri in verdict[
            "reasons"
        ][0]["message"]
        assert (
            dict(vars(SchedulerJobRunner)),
            dict(vars(DatasetManager)),
            airflow_sqlalchemy.USE_ROW_LEVEL_LOCKING,
        ) == before
        assert "_decide_dataset_triggered_runs" not in vars(SchedulerJobRunner)
    finally:
        w.close()


def test_a_pending_event_is_no_audit_finding(world):
    """audit counts an unconsumed event dated before a later run as suspected lost; explain does not when the
    next run takes it."""
    w = world
    a, b = w.dataset("a"), w.dataset("b")
    d = w.consumer("d", DatasetAny(a, b))
    p, s = w.producer("P"), w.scheduler()
    if BACKEND != "sqlite":
        w.clock.stop()  # the servers' clock dates events; audit's "future" is this host's
    w.clock.at(1) if BACKEND == "sqlite" else None
    w.emit(p, a), p.finish()
    w.clock.at(3) if BACKEND == "sqlite" else None
    w.emit(p, b), p.finish()
    w.loop(s), s.finish()  # run at 3
    if BACKEND == "sqlite":  # this host's clock dates events: a producer whose clock lags
        w.clock.at(2), w.emit(p, a), p.finish()
    else:
        w.emit(p, a), p.finish()
        # as if it committed late: dated before the run, and so is its queue row
        with create_session() as session:
            from airflow.models.dataset import DatasetDagRunQueue, DatasetEvent

            newest = session.scalar(select(DatasetEvent.id).order_by(DatasetEvent.id.desc()).limit(1))
            run_date = max(date for date, _ in _runs(d).values())
            session.execute(
                update(DatasetEvent)
                .where(DatasetEvent.id == newest)
                .values(timestamp=run_date - timedelta(seconds=1))
            )
            session.execute(
                update(DatasetDagRunQueue)
                .where(DatasetDagRunQueue.target_dag_id == d)
                .values(created_at=run_date - timedelta(seconds=1))
            )
    w.clock.stop()
    found = _explain(d)
    assert found["verdict"]["creates_run"] and len(found["pending_events"]) == 1
    assert found["audit"]["counts"]["suspected_lost"] == 1 and found["audit"]["findings"] == {}


@pytest.mark.skipif(
    BACKEND == "sqlite", reason="a producer paused before its COMMIT holds SQLite's one writer"
)
def test_a_late_commit_on_a_quiet_dag_is_the_nets_run_and_pending(world, monkeypatch):
    """
    A late commit below the latest run that the net found (its finding kept in the ``log`` table):
    explain says that the net's run takes the event (``when``: ``net``), lists it as pending only
    because a run takes it, and the scheduler's next loop creates exactly that run.
    """
    from test_safety_net import LATENCY, commit_late_after_a_run

    monkeypatch.setenv(LATENCY, "1")
    d, ids, s = commit_late_after_a_run(world, quiet=True)
    time.sleep(0.5)  # the net looks at the ids at most every half second
    with create_session() as session:  # the net's look alone: its finding is kept, no run made yet
        assert d in s.runner._dags_with_stranded_dataset_events(session)
    found = _explain(d)
    verdict = found["verdict"]
    assert verdict["creates_run"] and verdict["when"] == "net", verdict
    assert verdict["run"]["event_ids"] == [ids["late"]] and "late commit's stamp" in verdict["read"]
    assert [e["id"] for e in found["pending_events"]] == [ids["late"]]
    assert found["audit"]["findings"] == {}  # audit's suspected-lost event is the net's run's
    w = world
    w.loop(s), s.finish()  # the net's finding brings the DAG in: the run explain named
    assert [ids["late"]] in [events for _, events in _runs(d).values()]
    assert w.checker.runs_predicted >= 1


@pytest.mark.skipif(
    BACKEND != "sqlite",
    reason="moves the database clock: SQLite's is this host's (explain reads the fix's own clock)",
)
def test_events_no_loop_reaches_are_never_pending(world, monkeypatch):
    """
    An event newer than the DAG's latest run whose queue row is gone, older than the sweep's
    reach (``event_lookback_seconds``): no loop picks the DAG, so explain says it waits
    (``not_queued``) and lists nothing as pending, "its next run takes them" (issue 31, item 9).
    """
    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__EVENT_LOOKBACK_SECONDS", "60")
    w = world
    a = w.dataset("a")
    d = w.consumer("d", [a])
    p, s = w.producer("P"), w.scheduler()
    w.clock.at(1), w.emit(p, a), p.finish()
    w.clock.at(2), w.loop(s), s.finish()  # run 1
    w.clock.at(3), w.emit(p, a), p.finish()
    with create_session() as session:  # its queue row lost (a stock scheduler's delete, say)
        session.execute(delete(DatasetDagRunQueue).where(DatasetDagRunQueue.target_dag_id == d))
    w.clock.at(200)  # beyond the sweep's reach
    found = _explain(d)
    assert not found["verdict"]["creates_run"], found["verdict"]
    assert [r["code"] for r in found["verdict"]["reasons"]] == ["not_queued"], found["verdict"]
    assert found["pending_events"] == [] and all(not ds["pending_event_ids"] for ds in found["datasets"])
    w.loop(s), s.finish()
    assert len(_runs(d)) == 1  # and indeed no loop takes it
