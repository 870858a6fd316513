"""Processes killed with SIGKILL mid-transaction: nothing committed on the side, nothing lost or doubled."""

from __future__ import annotations

from airflow.models.dagrun import DagRun
from airflow.models.dataset import DatasetDagRunQueue, DatasetEvent, DatasetModel
from airflow.utils.session import create_session
from sqlalchemy import func, select

from reproduce.harness.faults import kill_when_ready
from reproduce.harness.world import World


def _queue_and_events(world: World, uri: str):
    with create_session() as session:
        dataset_id = session.scalar(select(DatasetModel.id).where(DatasetModel.uri == uri))
        events = session.scalar(select(func.count()).where(DatasetEvent.dataset_id == dataset_id))
        rows = session.execute(
            select(DatasetDagRunQueue.target_dag_id, DatasetDagRunQueue.created_at).where(
                DatasetDagRunQueue.dataset_id == dataset_id
            )
        ).all()
    return events, sorted(rows)


def test_killed_producer_leaves_no_event_and_no_queue_row(variant_fixed):
    world = World("kill_producer")
    try:
        a = world.dataset("a")
        world.consumer("d", [a])
        kill_when_ready("producer", a.uri)
        assert _queue_and_events(world, a.uri) == (0, [])
    finally:
        world.close()


def test_killed_producer_leaves_an_existing_queue_row_as_it_was(variant_fixed):
    world = World("kill_producer_row")
    try:
        a = world.dataset("a")
        world.consumer("d", [a])
        p = world.producer("P")
        world.emit(p, a), p.finish()
        before = _queue_and_events(world, a.uri)
        assert before[0] == 1 and len(before[1]) == 1
        kill_when_ready("producer", a.uri)  # its upsert moved the row, uncommitted
        assert _queue_and_events(world, a.uri) == before
    finally:
        world.close()


def test_killed_scheduler_leaves_the_queue_and_the_next_loop_creates_the_runs(variant_fixed):
    world = World("kill_scheduler")
    try:
        a = world.dataset("a")
        dag_id = world.consumer("d", [a])
        p = world.producer("P")
        for _ in range(3):
            world.emit(p, a), p.finish()
        kill_when_ready("scheduler")  # killed after INSERT INTO dag_run, before commit
        with create_session() as session:
            assert session.scalar(select(func.count()).where(DagRun.dag_id == dag_id)) == 0
        assert len(_queue_and_events(world, a.uri)[1]) == 1
        world.drain(world.scheduler(), start=None)
        report = world.report()
        assert report.violations() == {}, report.as_dict()
        assert report.by_dag()[dag_id].consumed == 3
    finally:
        world.close()
