"""
Which processes ran the fix over a period, read from the marks they left (``evidence``), Airflow's
``job`` table (every scheduler, with or without this package) and the dataset events' task
instances (every producer's host). Three statements, each bounded by the period.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

NO_MARK = "no mark: this package was not installed or loaded there (stock code, or a release before marks)"


def collect(session, since: datetime) -> dict:
    from sqlalchemy import and_, func, select
    from sqlalchemy.orm import aliased

    from airflow.jobs.job import Job
    from airflow.models.dataset import DatasetEvent
    from airflow.models.log import Log
    from airflow.models.taskinstance import TaskInstance as TI

    from airflow_dataset_race_fix.evidence import MARK_EVENT

    marks = [{**json.loads(extra), "at": dttm} for dttm, extra in session.execute(
        select(Log.dttm, Log.extra).where(Log.event == MARK_EVENT, Log.dttm >= since, Log.dag_id.is_(None))
        .order_by(Log.dttm))]
    components = []
    for job_id, host, started, heartbeat in session.execute(
        select(Job.id, Job.hostname, Job.start_date, Job.latest_heartbeat)
        .where(Job.job_type == "SchedulerJob", Job.latest_heartbeat >= since).order_by(Job.start_date)
    ):
        mark = next((m for m in marks if m["component"] == "scheduler" and m["host"] == host and "started" in m
                     and abs(datetime.fromisoformat(m["started"]) - started) < timedelta(seconds=1)), None)
        if mark is not None:
            marks.remove(mark)
        components.append({"component": f"scheduler (job {job_id})", "host": host, "first": started, "last": heartbeat,
                           **_verdict(mark)})
    for mark in marks:  # the other components' (triggerer, dag-processor, webserver workers)
        components.append({"component": mark["component"], "host": mark["host"], "first": mark["at"],
                           "last": mark["at"], **_verdict(mark)})

    # Each producing task instance's events, its host, and its mark (the newest; one a try and process).
    event = DatasetEvent
    per_task = (
        select(event.source_dag_id.label("dag_id"), event.source_task_id.label("task_id"),
               event.source_run_id.label("run_id"), event.source_map_index.label("map_index"),
               func.count().label("events"), func.min(event.timestamp).label("first"),
               func.max(event.timestamp).label("last"))
        .where(event.timestamp >= since).group_by(event.source_dag_id, event.source_task_id, event.source_run_id,
                                                  event.source_map_index).subquery()
    )
    newest = aliased(Log)
    newest_mark = (
        select(func.max(newest.id)).where(newest.event == MARK_EVENT, newest.dag_id == per_task.c.dag_id,
                                         newest.task_id == per_task.c.task_id, newest.run_id == per_task.c.run_id,
                                         newest.map_index == per_task.c.map_index).scalar_subquery()
    )
    producers = []
    for host, dag_id, task_id, extra, events, tasks, first, last in session.execute(
        select(TI.hostname, per_task.c.dag_id, per_task.c.task_id, Log.extra, func.sum(per_task.c.events),
               func.count(), func.min(per_task.c.first), func.max(per_task.c.last))
        .select_from(per_task)
        .outerjoin(TI, and_(TI.dag_id == per_task.c.dag_id, TI.task_id == per_task.c.task_id,
                            TI.run_id == per_task.c.run_id, TI.map_index == per_task.c.map_index))
        .outerjoin(Log, Log.id == newest_mark)
        .group_by(TI.hostname, per_task.c.dag_id, per_task.c.task_id, Log.extra)
        .order_by(TI.hostname, per_task.c.dag_id, per_task.c.task_id)
    ):
        mark = json.loads(extra) if extra else None
        where = host or ("(no task instance row)" if dag_id is not None else "(not a task: the REST API or a script)")
        producers.append({"host": where,
                          "dag_id": dag_id, "task_id": task_id, "events": int(events), "task_instances": tasks,
                          "first": first, "last": last, **_verdict(mark if dag_id is not None else {})})
    everything = components + producers
    return {"since": since, "components": components, "producers": producers,
            "all_fixed": all(row["fixed"] is not False for row in everything)}


def _verdict(mark: dict | None) -> dict:
    if mark == {}:  # events outside a task: their processes' marks are among the components
        return {"fixed": None, "why": "see the webserver workers' marks among the components"}
    if mark is None:
        return {"fixed": False, "why": NO_MARK}
    return {"fixed": bool(mark["fixed"]), "why": mark.get("how") or mark.get("why", "")}


def render(found: dict) -> str:
    lines = [f"Since {found['since']:%Y-%m-%d %H:%M:%S} UTC:", "Components (schedulers from the job table, the "
             "rest from their marks):"]
    for row in found["components"] or [{"none": True}]:
        lines.append("  none seen" if "none" in row else
                     f"  {_word(row)} {row['component']} on {row['host']}, {row['first']:%Y-%m-%d %H:%M:%S} to "
                     f"{row['last']:%H:%M:%S}: {row['why']}")
    lines.append("Producers (dataset events by the host of the task instance that made them):")
    for row in found["producers"] or [{"none": True}]:
        lines.append("  none seen" if "none" in row else
                     f"  {_word(row)} {row['host']}: {row['dag_id'] or ''}.{row['task_id'] or ''}, {row['events']} events of "
                     f"{row['task_instances']} task instances, {row['first']:%Y-%m-%d %H:%M:%S} to "
                     f"{row['last']:%H:%M:%S}: {row['why']}")
    lines.append("Every process seen ran the fix" if found["all_fixed"] else
                 "NOT every process seen ran the fix (the NOT FIXED lines above)")
    return "\n".join(lines)


def _word(row: dict) -> str:
    return {True: "FIXED    ", False: "NOT FIXED", None: "UNKNOWN  "}[row["fixed"]]
