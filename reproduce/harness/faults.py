"""
Crash a producer or a scheduler mid-transaction with SIGKILL, from a separate interpreter.

The child (``python -m reproduce.harness.faults producer URI`` or
``... scheduler``) inherits the parent's Airflow environment, puts the fix in place,
starts its work and stops at the named point: after the event is flushed (producer) or
after the new DAG run row is inserted (scheduler), with nothing committed. It prints
``READY`` and waits; the parent kills it with SIGKILL and reads the tables.

``run_producer`` is the same child without a crash: one event, committed, by stock or
fixed code (a process not yet restarted during a rolling upgrade, say).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from reproduce import lab_command

READY = "READY"


def kill_when_ready(role: str, *args: str, fixed: bool = True, timeout: float = 120.0) -> None:
    """Start the child, wait for READY, SIGKILL it, and reap it."""
    env = dict(os.environ, ADRF_FAULT_FIXED="1" if fixed else "0")
    child = subprocess.Popen(
        [*lab_command("reproduce.harness.faults"), role, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + timeout
    try:
        for line in child.stdout:
            if line.strip() == READY:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{role} child never reached its crash point")
        else:
            raise RuntimeError(f"{role} child exited before its crash point: {child.stderr.read()[-2000:]}")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout)
    if child.returncode != -signal.SIGKILL:
        raise RuntimeError(f"{role} child was not killed by SIGKILL (exit {child.returncode})")


def run_producer(uri: str, *, fixed: bool, clock_offset: float = 0.0, timeout: float = 120.0) -> None:
    """
    One producer transaction (register an event on ``uri``, commit) in a separate interpreter.

    ``clock_offset``: seconds the child's host clock runs ahead (negative: behind).
    """
    env = dict(os.environ, ADRF_FAULT_FIXED="1" if fixed else "0")
    done = subprocess.run(
        [*lab_command("reproduce.harness.faults"), "commit", uri, str(clock_offset)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"producer child failed (exit {done.returncode}): {done.stderr[-2000:]}")


def _commit(uri: str, clock_offset: str = "0") -> None:
    from datetime import datetime, timedelta, timezone

    import time_machine
    from airflow import settings
    from airflow.datasets import Dataset
    from airflow.datasets.manager import dataset_manager

    time_machine.travel(
        datetime.now(timezone.utc) + timedelta(seconds=float(clock_offset)), tick=True
    ).start()
    session = settings.Session.session_factory()
    dataset_manager.register_dataset_change(dataset=Dataset(uri), session=session)
    session.commit()


def _stop_here() -> None:
    print(READY, flush=True)
    while True:
        time.sleep(60)


def _producer(uri: str) -> None:
    from airflow import settings
    from airflow.datasets import Dataset
    from airflow.datasets.manager import dataset_manager

    session = settings.Session.session_factory()
    dataset_manager.register_dataset_change(dataset=Dataset(uri), session=session)
    session.flush()  # the event is written, not committed (the fix writes queue rows at commit)
    _stop_here()


def _scheduler() -> None:
    from airflow import settings
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.utils.sqlalchemy import prohibit_commit
    from sqlalchemy import event

    session = settings.Session.session_factory()
    job = Job()
    session.add(job)
    session.commit()
    runner = SchedulerJobRunner(job=job, num_runs=1)

    @event.listens_for(settings.engine, "after_cursor_execute")
    def crash_after_run_insert(conn, cursor, statement, *args):
        if statement.lstrip().lower().startswith("insert into dag_run "):
            _stop_here()

    with prohibit_commit(session) as guard:
        runner._create_dagruns_for_dags(guard=guard, session=session)
    raise SystemExit("the scheduler loop created no run: nothing to crash in")


def main(argv: list[str]) -> None:
    import airflow_dataset_race_fix

    if os.environ.get("ADRF_FAULT_FIXED") == "1":
        airflow_dataset_race_fix.apply(strict=True)
    role, *args = argv
    {"producer": _producer, "scheduler": _scheduler, "commit": _commit}[role](*args)


if __name__ == "__main__":
    main(sys.argv[1:])
