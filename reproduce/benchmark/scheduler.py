"""The scheduler as the cases run it: a runner of its own, its passes, a rolled-back loop, a drain."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from reproduce.benchmark.runner import first_line


def new_scheduler_runner():
    """A ``SchedulerJobRunner`` with a Job of its own: one scheduler process's state."""
    from airflow import settings
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner

    with settings.Session() as session:
        job = Job()
        session.add(job)
        session.commit()
        return SchedulerJobRunner(job=job, num_runs=1)


def scheduler_pass(runner, session) -> str | None:
    """One real scheduler pass of run creation (``_create_dagruns_for_dags``, which commits); the error if it
    failed."""
    from airflow.utils.sqlalchemy import prohibit_commit

    try:
        with prohibit_commit(session) as guard:
            runner._create_dagruns_for_dags(guard=guard, session=session)
        return None
    except Exception as err:  # reported, not hidden
        session.rollback()
        return first_line(err)


def timed_loop(
    runner, dag_names: list[str], per_loop: int = 10, made: Callable[[str, Any], None] | None = None
) -> Callable[[str], float]:
    """A sample: one loop creating the runs of ``dag_names`` (all of them, or it raises), rolled back
    (``made(variant, session)`` before that)."""
    from airflow import settings
    from airflow.models.dag import DagModel

    def measure(variant: str) -> float:
        session = settings.Session.session_factory()
        saved, DagModel.NUM_DAGS_PER_DAGRUN_QUERY = DagModel.NUM_DAGS_PER_DAGRUN_QUERY, per_loop
        try:
            started = time.perf_counter()
            create_dataset_triggered_runs(runner, session)
            elapsed = time.perf_counter() - started
            created = runs_created(session, dag_names)
            if created != len(dag_names):
                raise AssertionError(f"{variant} loop created {created} runs, expected {len(dag_names)}")
            if made is not None:
                made(variant, session)
            return elapsed
        finally:
            DagModel.NUM_DAGS_PER_DAGRUN_QUERY = saved
            session.rollback()
            session.close()

    return measure


def create_dataset_triggered_runs(runner, session) -> None:
    """``SchedulerJobRunner._create_dagruns_for_dags`` up to (not including) its commit."""
    from airflow.models.dag import DagModel

    query, info = DagModel.dags_needing_dagruns(session)
    dag_models = [dm for dm in query.all() if dm.dag_id in info]
    runner._create_dag_runs_dataset_triggered(dag_models, info, session)
    session.flush()


def runs_created(session, dag_ids: list[str]) -> int:
    from airflow.models.dagrun import DagRun
    from airflow.utils.state import DagRunState
    from sqlalchemy import func, select

    return session.scalar(
        select(func.count()).where(DagRun.dag_id.in_(dag_ids), DagRun.state == DagRunState.QUEUED)
    )


def finish_runs(dag_ids: list[str]) -> None:
    """Mark the queued and running runs of ``dag_ids`` successful, as running them would."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from sqlalchemy import update

    with create_session() as session:
        session.execute(
            update(DagRun)
            .where(DagRun.dag_id.in_(dag_ids), DagRun.state.in_((DagRunState.QUEUED, DagRunState.RUNNING)))
            .values(state=DagRunState.SUCCESS)
            .execution_options(synchronize_session=False)
        )


def drain(runner, dag_ids: list[str], max_passes: int = 20) -> list[str]:
    """Scheduler passes (runs finished in between) until ``dag_ids`` have no queue row left; the errors."""
    from airflow import settings
    from airflow.models.dataset import DatasetDagRunQueue
    from sqlalchemy import func, select

    errors = []
    session = settings.Session.session_factory()
    try:
        for _ in range(max_passes):
            finish_runs(dag_ids)
            if error := scheduler_pass(runner, session):
                errors.append(f"drain: {error}")
            left = session.scalar(select(func.count()).where(DatasetDagRunQueue.target_dag_id.in_(dag_ids)))
            session.commit()
            if not left:
                break
    finally:
        session.close()
    finish_runs(dag_ids)
    return errors


def net_caught_up(runner) -> bool:
    """Whether a fixed runner's net has read every committed id since its start (a first start reads the last
    10 000 again, a restart on from the marks) and probed every late event among them."""
    from airflow import settings
    from airflow.models.dataset import DatasetEvent
    from sqlalchemy import func, select

    net = runner.__dict__.get("_dataset_race_fix_net")
    if net is None or net.high is None or net.late or net.below:
        return False
    with settings.Session() as session:
        return net.high >= (session.scalar(select(func.max(DatasetEvent.id))) or 0)
