"""
Producers for ``reproduce --e2e``: many mapped tasks that each emit one dataset event.

``race_producer_a`` expands ADRF_E2E_MAPPED tasks (default 30) with outlet dataset ``a``:
every task instance that succeeds registers one event on ``a`` in its own transaction,
so a triggered run is a burst of concurrent producers. ``race_producer_b`` emits a few
events on ``b`` so that the AND consumer runs too. Each task sleeps a short, seeded
time (ADRF_E2E_SEED) so that stock and fixed runs see the same load, and returns
whether the fix is in place in its process (XCom), which the reproduction counts.
With ADRF_E2E_MAPPED_MULTI > 0 (the Celery run) ``race_producer_ab`` has two mapped
tasks of that many instances: ``emit_ab`` with outlets ``[a, b]`` and ``emit_ba`` with
``[b, a]``. Each instance registers one event per outlet, in outlet order, in one
transaction, so transactions side by side touch the same queue rows in opposite orders.
ADRF_E2E_RETRIES / ADRF_E2E_RETRY_DELAY (seconds) give the producers Airflow task retries
(default none: the LocalExecutor run counts a failed producer as failed; the Celery run
lets Airflow's own recovery retry the tasks its chaos killed).
"""

from __future__ import annotations

import os
import random
import time
from datetime import datetime, timedelta

from airflow import DAG
from airflow.datasets import Dataset
from airflow.decorators import task

MAPPED = int(os.environ.get("ADRF_E2E_MAPPED", "30"))
MAPPED_B = int(os.environ.get("ADRF_E2E_MAPPED_B", "5"))
SEED = int(os.environ.get("ADRF_E2E_SEED", "0"))
MAPPED_MULTI = int(os.environ.get("ADRF_E2E_MAPPED_MULTI", "0"))
MAX_SLEEP = float(os.environ.get("ADRF_E2E_MAX_SLEEP", "1.0"))
A = Dataset("race-e2e://datasets/a")
B = Dataset("race-e2e://datasets/b")
DEFAULT_ARGS = {
    "retries": int(os.environ.get("ADRF_E2E_RETRIES", "0")),
    "retry_delay": timedelta(seconds=float(os.environ.get("ADRF_E2E_RETRY_DELAY", "5"))),
}
PATCH_MARKER = "__airflow_dataset_race_fix_patched__"  # set on a class the fix patched


def fix_state() -> dict[str, bool]:
    """Whether the producer path and the scheduler code carry the fix in this process."""
    import importlib

    manager = importlib.import_module("airflow.datasets.manager").DatasetManager
    scheduler = importlib.import_module("airflow.jobs.scheduler_job_runner").SchedulerJobRunner
    return {"producer_path": PATCH_MARKER in vars(manager), "scheduler": PATCH_MARKER in vars(scheduler)}


def _producer_dag(dag_id: str) -> DAG:
    return DAG(
        dag_id,
        schedule=None,
        start_date=datetime(2024, 1, 1),
        catchup=False,
        max_active_runs=16,
        default_args=DEFAULT_ARGS,
        tags=["airflow-dataset-race-fix"],
    )


def _seeded_sleep(run_id: str, index: int) -> None:
    time.sleep(random.Random(f"{SEED}/{run_id}/{index}").uniform(0, MAX_SLEEP))


with _producer_dag("race_producer_a"):

    @task(outlets=[A])
    def emit_a(index: int, run_id=None) -> dict[str, bool]:
        _seeded_sleep(run_id, index)
        return fix_state()

    emit_a.expand(index=list(range(MAPPED)))


with _producer_dag("race_producer_b"):

    @task(outlets=[B])
    def emit_b(index: int, run_id=None) -> dict[str, bool]:
        _seeded_sleep(run_id, index)
        return fix_state()

    emit_b.expand(index=list(range(MAPPED_B)))


if MAPPED_MULTI > 0:
    with _producer_dag("race_producer_ab"):

        @task(outlets=[A, B])
        def emit_ab(index: int, run_id=None) -> dict[str, bool]:
            _seeded_sleep(run_id, index)
            return fix_state()

        @task(outlets=[B, A])
        def emit_ba(index: int, run_id=None) -> dict[str, bool]:
            _seeded_sleep(run_id, 1000 + index)
            return fix_state()

        emit_ab.expand(index=list(range(MAPPED_MULTI)))
        emit_ba.expand(index=list(range(MAPPED_MULTI)))
