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

    # Each producing task instance's events and host, and its host's producer mark of that hour: a task with
    # outlets finds or writes it as it starts (evidence.py), so one lies within an hour of the task's start.
    event = DatasetEvent
    per_task = (
        select(event.source_dag_id.label("dag_id"), event.source_task_id.label("task_id"),
               event.source_run_id.label("run_id"), event.source_map_index.label("map_index"),
               func.count().label("events"), func.min(event.timestamp).label("first"),
               func.max(event.timestamp).label("last"))
        .where(event.timestamp >= since).group_by(event.source_dag_id, event.source_task_id, event.source_run_id,
                                                  event.source_map_index).subquery()
    )
    rows = session.execute(
        select(TI.hostname, per_task.c.dag_id, per_task.c.task_id, per_task.c.events, per_task.c.first,
               per_task.c.last, TI.start_date)
        .select_from(per_task)
        .outerjoin(TI, and_(TI.dag_id == per_task.c.dag_id, TI.task_id == per_task.c.task_id,
                            TI.run_id == per_task.c.run_id, TI.map_index == per_task.c.map_index))
    ).all()
    hour = timedelta(hours=1)
    earliest = min([since, *(started or first for *_, first, _, started in rows)]) - hour
    host_marks: dict[str, list] = {}
    for dttm, extra in session.execute(select(Log.dttm, Log.extra).where(
            Log.event == MARK_EVENT, Log.dttm >= earliest, Log.extra.like('%"component": "task"%'))):
        mark = json.loads(extra)
        host_marks.setdefault(mark["host"], []).append((dttm, mark))
    groups: dict[tuple, dict] = {}
    for host, dag_id, task_id, events, first, last, started in rows:
        near = [mark for dttm, mark in host_marks.get(host, []) if abs(dttm - (started or first)) <= hour]
        verdict = _verdict(min(near, key=lambda m: m["fixed"], default=None) if dag_id is not None else {})
        where = host or ("(no task instance row)" if dag_id is not None else "(not a task: the REST API or a script)")
        row = groups.setdefault((where, dag_id or "", task_id or "", verdict["fixed"], verdict["why"]), {
            "host": where, "dag_id": dag_id, "task_id": task_id, "events": 0, "task_instances": 0,
            "first": first, "last": last, **verdict})
        row.update(events=row["events"] + int(events), task_instances=row["task_instances"] + 1,
                   first=min(row["first"], first), last=max(row["last"], last))
    producers = [groups[key] for key in sorted(groups, key=lambda key: tuple(map(str, key)))]
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
