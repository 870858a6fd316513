"""
What each process leaves in Airflow's ``log`` table (the audit log) about its own code, so one command and
the page can tell which components and producer hosts ran the fix. No migration: a mark is a ``log`` row
with ``event`` = MARK_EVENT, written in a transaction of its own, never a producer's: one as each component
starts (never from a task process), and one per host, verdict and hour from the tasks with outlets as they
start. A host without this package writes nothing. What, when, and its bound: docs/activation.md, "The marks".
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import tempfile
import time

from airflow import settings
from airflow.models.log import Log
from airflow.utils.net import get_hostname
from sqlalchemy.orm import Session

from airflow_dataset_race_fix import __version__, runtime, verdict

MARK_EVENT = "dataset-race-fix"

log = logging.getLogger("airflow_dataset_race_fix")


def _mark_extra(component: str, started=None) -> str:
    """The mark's ``extra``: the same text for every task of a host and verdict, so the reader groups them."""
    fixed, how = verdict.process_verdict()
    extra = {
        "component": component,
        "fixed": fixed,
        "how" if fixed else "why": how,
        "host": get_hostname(),
        "airflow": runtime.airflow_version(),
        "package": __version__,
    }
    if started is not None:
        extra["started"] = started.isoformat()
    return json.dumps(extra, sort_keys=True)


def mark_component(component: str, started=None) -> None:
    """A component's mark at its start."""
    try:
        _write(_mark_extra(component, started))
    except Exception as err:  # the audit log is evidence, never a reason to stop a component
        log.warning("airflow-dataset-race-fix: could not record this %s's mark: %s", component, err)


def mark_producer(task_instance) -> None:
    """At a task's start: its host's producer mark, if the task has outlets and none was written this hour."""
    try:
        if getattr(getattr(task_instance, "task", None), "outlets", None):
            _once_an_hour(_mark_extra("task"), task_instance)
    except Exception as err:  # never a reason to fail or hold up a producer
        log.warning("airflow-dataset-race-fix: could not record this producer's mark: %s", err)


def _once_an_hour(extra: str, task_instance) -> None:
    key = hashlib.sha256(f"{settings.SQL_ALCHEMY_CONN}\n{extra}".encode()).hexdigest()[:16]
    hour = str(int(time.time() // 3600))
    path = os.path.join(tempfile.gettempdir(), f"airflow-dataset-race-fix-{os.getuid()}-{key}")
    with open(path, "a+") as claim:
        try:
            fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another task of this host is writing this very mark
        claim.seek(0)
        if claim.read() != hour:
            _write(extra, task_instance)  # the row names the task that wrote it
            claim.truncate(0)
            claim.write(hour)


def _write(extra: str, task_instance=None) -> None:
    with Session(bind=settings.engine) as session:
        session.add(Log(MARK_EVENT, task_instance=task_instance, extra=extra))
        session.commit()
