"""
What each process leaves in Airflow's ``log`` table (the audit log) about its own code, so one
command and the page can tell which components and producer hosts ran the fix (docs/activation.md,
"Which processes run the fix"). No migration: a mark is a ``log`` row with ``event`` = MARK_EVENT.

- A long-running component (scheduler, triggerer, dag-processor, a webserver worker) writes one
  mark as it starts, in a transaction of its own: one small INSERT per process start.
- A producer task writes one mark per task instance and process with its first
  dataset event, in the producer's own session: it commits with the event or not at all, and adds
  one INSERT to that transaction, none elsewhere. A new ``log`` row locks nothing another
  transaction waits for (PostgreSQL: none; InnoDB: the new row, and the auto-increment only while
  it is allocated; SQLite holds its one write lock already), so the lock order is unchanged.
  A host without this package writes nothing; its events are named by their task instance's host.
"""

from __future__ import annotations

import json
import logging
import os
import sys

MARK_EVENT = "dataset-race-fix"
_marked: set[tuple] = set()  # producers' marks written by this process (pid first: a fork marks again)

log = logging.getLogger("airflow_dataset_race_fix")


def _mark_extra(component: str, started=None) -> str:
    """The mark's ``extra``: the same text for every task of a host and verdict, so the reader groups them."""
    from airflow.utils.net import get_hostname

    from airflow_dataset_race_fix import __version__, runtime, verdict

    fixed, how = verdict.process_verdict()
    extra = {"component": component, "fixed": fixed, "how" if fixed else "why": how, "host": get_hostname(),
             "airflow": runtime.airflow_version(), "package": __version__}
    if started is not None:
        extra["started"] = started.isoformat()
    return json.dumps(extra, sort_keys=True)


def mark_component(component: str, started=None) -> None:
    """A component's mark at its start, committed in a session and connection of its own."""
    try:
        from sqlalchemy.orm import Session

        from airflow import settings
        from airflow.models.log import Log

        with Session(bind=settings.engine) as session:
            session.add(Log(MARK_EVENT, extra=_mark_extra(component, started)))
            session.commit()
    except Exception as err:  # the audit log is evidence, never a reason to stop a component
        log.warning("airflow-dataset-race-fix: could not record this %s's mark: %s", component, err)


def mark_producer() -> None:
    """Called by the ``on_dataset_changed`` listener, inside ``register_dataset_change``: add the mark to that
    call's session (its frame, a few above: pluggy's), once per task instance and process. Events posted
    outside a task (the REST API) carry no task to name: the webserver workers' marks stand for them."""
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "register_dataset_change" and "session" in frame.f_locals):
        frame = frame.f_back
    task_instance = frame.f_locals.get("task_instance") if frame is not None else None
    if task_instance is None:
        return
    key = (os.getpid(), task_instance.dag_id, task_instance.task_id, task_instance.run_id, task_instance.map_index)
    if key not in _marked:
        _marked.add(key)
        from airflow.models.log import Log

        frame.f_locals["session"].add(Log(MARK_EVENT, task_instance=task_instance, extra=_mark_extra("task")))
