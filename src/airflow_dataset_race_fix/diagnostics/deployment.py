"""
Which processes ran the fix over a period, read from the marks they left (``evidence``), Airflow's
``job`` table (every scheduler, triggerer and dag-processor, with or without this package) and the
dataset events' task instances (every producer's host). The JSON form: docs/deployment-json.md.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

SCHEMA = "airflow-dataset-race-fix/deployment/1"
MAX_HOURS = 24 * 366  # --hours and ?hours=: a year, leap day included
WORDS = {True: "FIXED    ", False: "NOT FIXED", None: "UNKNOWN  "}  # a row's "fixed", as render says it
NO_MARK = "no mark: this package was not installed or loaded there (stock code, or a release before marks)"
JOBS = {"SchedulerJob": "scheduler", "TriggererJob": "triggerer", "DagProcessorJob": "dag-processor"}
# A component's mark carries its Job()'s start; the job row's start is later, when run_job begins.
MARK_BEFORE_JOB, MARK_AFTER_JOB = timedelta(minutes=1), timedelta(seconds=1)


def period_hours(text: str) -> float:
    """The one rule for ``deployment --hours`` and the page's ``?hours=``; ValueError says it in a line."""
    try:
        hours = float(text)
    except ValueError:
        hours = float("nan")
    if not 0 < hours <= MAX_HOURS:  # nan and inf fail here too
        raise ValueError(f"hours {text!r}: expected a number above 0 and at most {MAX_HOURS} (366 days)")
    return hours


def collect(session, hours: float) -> dict:
    """What ``deployment`` prints: each process seen over the last ``hours``, and whether it ran the fix."""
    from airflow.jobs.job import Job
    from airflow.models.dataset import DatasetEvent
    from airflow.models.log import Log
    from airflow.models.taskinstance import TaskInstance as TI
    from sqlalchemy import and_, func, or_, select

    from airflow_dataset_race_fix.evidence import MARK_EVENT

    since = datetime.now(timezone.utc) - timedelta(hours=hours)
    jobs = session.scalars(
        select(Job).where(Job.job_type.in_(JOBS), Job.latest_heartbeat >= since).order_by(Job.start_date)
    ).all()
    # A job alive in the period may have started, and written its mark, long before it.
    marked_before = [
        Log.dttm.between(job.start_date - MARK_BEFORE_JOB, job.start_date + MARK_AFTER_JOB)
        for job in jobs
        if job.start_date < since
    ]
    marks = [
        {**json.loads(extra), "at": dttm}
        for dttm, extra in session.execute(
            select(Log.dttm, Log.extra)
            .where(Log.event == MARK_EVENT, Log.dag_id.is_(None), or_(Log.dttm >= since, *marked_before))
            .order_by(Log.dttm)
        )
    ]
    components = []
    for job in jobs:
        component, host = JOBS[job.job_type], job.hostname
        own = [m for m in marks if (m["component"], m["host"]) == (component, host) and "started" in m]
        offsets = [(datetime.fromisoformat(m["started"]) - job.start_date, m) for m in own]
        mark = next((m for offset, m in offsets if -MARK_BEFORE_JOB < offset < MARK_AFTER_JOB), None)
        if mark is not None:
            marks.remove(mark)
        stopped = None if job.is_alive() else job.end_date or job.latest_heartbeat
        components.append(
            {
                "component": component,
                "job_id": job.id,
                "host": host,
                "first": job.start_date,
                "last": job.latest_heartbeat,
                "stopped": stopped,
                **_verdict(mark),
            }
        )
    # The webserver workers'. A job component's mark that matches no job is no component's: tasks write
    # none, but earlier releases wrote one from each task forked from a LocalExecutor scheduler.
    for mark in (m for m in marks if m["component"] not in JOBS.values()):
        components.append(
            {
                "component": mark["component"],
                "job_id": None,
                "host": mark["host"],
                "first": mark["at"],
                "last": mark["at"],
                "stopped": None,
                **_verdict(mark),
            }
        )
    # Each producing task instance's events and host, and its host's producer mark of that hour: a task with
    # outlets finds or writes it as it starts (evidence.py), so one lies within an hour of the task's start.
    event = DatasetEvent
    per_task = (
        select(
            event.source_dag_id.label("dag_id"),
            event.source_task_id.label("task_id"),
            event.source_run_id.label("run_id"),
            event.source_map_index.label("map_index"),
            func.count().label("events"),
            func.min(event.timestamp).label("first"),
            func.max(event.timestamp).label("last"),
        )
        .where(event.timestamp >= since)
        .group_by(event.source_dag_id, event.source_task_id, event.source_run_id, event.source_map_index)
        .subquery()
    )
    rows = session.execute(
        select(
            TI.hostname,
            per_task.c.dag_id,
            per_task.c.task_id,
            per_task.c.events,
            per_task.c.first,
            per_task.c.last,
            TI.start_date,
        )
        .select_from(per_task)
        .outerjoin(
            TI,
            and_(
                TI.dag_id == per_task.c.dag_id,
                TI.task_id == per_task.c.task_id,
                TI.run_id == per_task.c.run_id,
                TI.map_index == per_task.c.map_index,
            ),
        )
    ).all()
    hour = timedelta(hours=1)
    earliest = min([since, *(started or first for *_, first, _, started in rows)]) - hour
    host_marks: dict[str, list] = {}
    for dttm, extra in session.execute(
        select(Log.dttm, Log.extra).where(
            Log.event == MARK_EVENT, Log.dttm >= earliest, Log.extra.like('%"component": "task"%')
        )
    ):
        mark = json.loads(extra)
        host_marks.setdefault(mark["host"], []).append((dttm, mark))
    groups: dict[tuple, dict] = {}
    for host, dag_id, task_id, events, first, last, started in rows:
        near = [mark for dttm, mark in host_marks.get(host, []) if abs(dttm - (started or first)) <= hour]
        verdict = _verdict(min(near, key=lambda m: m["fixed"], default=None) if dag_id is not None else {})
        where = host or (
            "(no task instance row)" if dag_id is not None else "(not a task: the REST API or a script)"
        )
        row = groups.setdefault(
            (where, dag_id or "", task_id or "", verdict["fixed"], verdict["why"]),
            {
                "host": where,
                "dag_id": dag_id,
                "task_id": task_id,
                "events": 0,
                "task_instances": 0,
                "first": first,
                "last": last,
                **verdict,
            },
        )
        row.update(
            events=row["events"] + int(events),
            task_instances=row["task_instances"] + 1,
            first=min(row["first"], first),
            last=max(row["last"], last),
        )
    producers = [groups[key] for key in sorted(groups, key=lambda key: tuple(map(str, key)))]
    return {
        "schema": SCHEMA,
        "since": since,
        "components": components,
        "producers": producers,
        "all_fixed": all(row["fixed"] is not False for row in components + producers),
    }


def _verdict(mark: dict | None) -> dict:
    if mark == {}:  # events outside a task: their processes' marks are among the components
        return {"fixed": None, "why": "see the webserver workers' marks among the components"}
    if mark is None:
        return {"fixed": False, "why": NO_MARK}
    return {"fixed": bool(mark["fixed"]), "why": mark.get("how") or mark.get("why", "")}


def render(found: dict) -> str:
    time = "%Y-%m-%d %H:%M:%S"
    lines = [
        f"Since {found['since']:{time}} UTC:",
        "Components (schedulers, triggerers, dag-processors: the job table; webserver workers: marks):",
    ]
    for row in found["components"]:
        job = f" (job {row['job_id']})" if row["job_id"] else ""
        until = f"stopped {row['stopped']:{time}}" if row["stopped"] else f"seen {row['last']:{time}}"
        lines.append(
            f"  {WORDS[row['fixed']]} {row['component']}{job} on {row['host']}, "
            f"started {row['first']:{time}}, {until}: {row['why']}"
        )
    lines += [] if found["components"] else ["  none seen"]
    lines.append("Producers (dataset events by the host of the task instance that made them):")
    for row in found["producers"]:
        task = f"{row['dag_id'] or ''}.{row['task_id'] or ''}, {row['events']} events"
        lines.append(
            f"  {WORDS[row['fixed']]} {row['host']}: {task} of {row['task_instances']} "
            f"task instances, {row['first']:{time}} to {row['last']:{time}}: {row['why']}"
        )
    lines += [] if found["producers"] else ["  none seen"]
    lines.append(
        "Every process seen ran the fix"
        if found["all_fixed"]
        else "NOT every process seen ran the fix (the NOT FIXED lines above)"
    )
    return "\n".join(lines)
