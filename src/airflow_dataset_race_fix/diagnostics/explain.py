"""
Why a dataset-triggered DAG runs next, or waits: the verdict of the fixed scheduler's own code, read-only.

What it answers, where the verdict comes from, what it cannot see and its cost: docs/explain.md
(the JSON form, ``SCHEMA``, too). In short: no second copy of the scheduler's logic, the fix's
own functions bound for explain alone (``_fixed_code``), so the verdict is the fixed
scheduler's whether or not the fix is active here and nothing in the process changes; no row
lock, nothing written, the caller's transaction rolled back.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

SCHEMA = "airflow-dataset-race-fix/explain/1"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class ExplainError(ValueError):
    """Bad input: an unknown DAG, or one that is not dataset-scheduled."""


def _fixed_code():
    """
    ``(runner_class, manager_class, dags_needing_dagruns)``, bound for explain alone:
    a ``SchedulerJobRunner`` subclass with the fix's added members (the functions the shim
    installs) and the fix's ``DatasetManager``, and Airflow's ``dags_needing_dagruns`` with a
    ``with_row_locks`` that adds none: no scheduler skips a DAG, no producer waits, and no
    process-wide switch is flipped (a webserver's other requests are not affected).
    """
    import inspect
    import types

    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.models.dag import DagModel

    from airflow_dataset_race_fix.fix.datasets.manager import DatasetManager as FixedManager
    from airflow_dataset_race_fix.fix.jobs.scheduler_job_runner import SchedulerJobRunner as FixedRunner
    from airflow_dataset_race_fix.targets import members_of

    added = {
        member.name: vars(FixedRunner)[member.name]
        for member in members_of("airflow.jobs.scheduler_job_runner")
        if member.original_sha256 is None
    }
    runner_class = type(
        "ExplainSchedulerJobRunner",
        (SchedulerJobRunner,),
        {**added, "_dataset_manager": staticmethod(lambda: FixedManager)},
    )

    def no_row_locks(query, session, **kwargs):
        return query

    function = inspect.unwrap(vars(DagModel)["dags_needing_dagruns"].__func__)
    globals_without_locks = {**function.__globals__, "with_row_locks": no_row_locks}
    needing = types.FunctionType(
        function.__code__,
        globals_without_locks,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )
    return runner_class, FixedManager, lambda session: needing(DagModel, session=session)


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(timezone.utc).isoformat() if value is not None else None


def dataset_uris(session: Session, ids) -> dict[int, str]:
    """The URIs of the datasets with these ids."""
    from airflow.models.dataset import DatasetModel

    return dict(
        session.execute(select(DatasetModel.id, DatasetModel.uri).where(DatasetModel.id.in_(ids))).all()
    )


def _event(event, uris: dict[int, str]) -> dict[str, Any]:
    return {
        "id": event.id,
        "dataset_uri": uris.get(event.dataset_id, f"dataset #{event.dataset_id}"),
        "timestamp": _iso(event.timestamp),
        "source_dag_id": event.source_dag_id,
        "source_run_id": event.source_run_id,
        "source_task_id": event.source_task_id,
        "extra": event.extra or {},
    }


def condition_tree(condition, with_events: set[str]) -> dict[str, Any]:
    """
    The DAG's dataset condition as nested dicts: ``all``/``any``/``alias`` nodes and ``dataset`` leaves,
    each with ``met``.
    """
    from airflow.datasets import Dataset, DatasetAll

    statuses = {uri: True for uri in with_events}
    if isinstance(condition, Dataset):
        return {"type": "dataset", "uri": condition.uri, "met": condition.uri in with_events}
    children = [condition_tree(child, with_events) for child in getattr(condition, "objects", ())]
    if "Alias" in type(condition).__name__:  # an alias resolves to the datasets it has seen
        node: dict[str, Any] = {"type": "alias", "name": getattr(condition, "name", None)}
    else:
        node = {"type": "all" if isinstance(condition, DatasetAll) else "any"}
    try:
        met = bool(condition.evaluate(statuses))
    except (AttributeError, NotImplementedError, TypeError):
        met = any(child["met"] for child in children)
    return {**node, "met": met, "children": children}


def _waiting_for(tree: dict[str, Any]) -> str:
    """What would make an unmet condition hold, e.g. ``s3://a and (s3://b or s3://c)``."""
    if tree["type"] == "dataset":
        return tree["uri"]
    unmet = [_waiting_for(child) for child in tree["children"] if not child["met"]]
    if tree["type"] == "all":
        return " and ".join(unmet)
    return unmet[0] if len(unmet) == 1 else "(" + " or ".join(unmet) + ")"


def _dag_or_error(session: Session, dag_id: str):
    from airflow.models.dag import DagModel

    dag_model = session.get(DagModel, dag_id)
    if dag_model is None:
        known = list(session.scalars(select(DagModel.dag_id)))
        close = difflib.get_close_matches(dag_id, known, n=5, cutoff=0.6)
        hint = f"; close matches: {', '.join(close)}" if close else ""
        raise ExplainError(f"no DAG {dag_id!r} in the metadata database{hint}")
    return dag_model


class LoopSelection:
    """
    What the next scheduler loop picks (``dags_needing_dagruns`` and the sweep), read once:
    it deserializes every queued DAG, so a page explaining many DAGs shares it (``loop=``).
    """

    def __init__(self, session: Session) -> None:
        from airflow.jobs.job import Job

        self.runner_class, self.manager_class, dags_needing_dagruns = _fixed_code()
        self.runner = self.runner_class(
            job=Job(), num_runs=1
        )  # a fresh scheduler state; the Job is never saved
        query, self.info = dags_needing_dagruns(session)
        self.picked = [dm.dag_id for dm in query.all()]
        # the net's findings read, nothing followed or written
        self.runner.__dict__["_dataset_race_fix_net"] = self.runner._DatasetNet(read_only=True)
        # the sweep's steps, without its row lock
        now = self.manager_class._database_now(session)
        oldest_new = self.runner._dags_with_new_unqueued_events(dict(self.info), now, session)
        swept = self.runner._runnable_dataset_dags(oldest_new, session, lock_rows=False) if oldest_new else []
        self.swept = {dm.dag_id for dm in swept}


# Why a run that the decision makes is not created by the next loop, by reason code.
_NOT_THIS_LOOP = {
    "no_slot": "this loop's {slots} DAG slots ([scheduler] max_dagruns_to_create_per_loop) go to DAGs that "
    "come first; a later loop takes it",
    "not_queued": "its events have no queue row and lie beyond the sweep's reach ([dataset_race_fix] "
    "event_lookback_seconds): 'audit --requeue' gives them one",
}


def when_it_runs(dag_id: str, loop: LoopSelection, by_net: bool = False) -> tuple[str | None, str | None]:
    """When the run the decision makes for ``dag_id`` is created ("net", "next loop", "next sweep"),
    or the reason code why not (``_NOT_THIS_LOOP``)."""
    if by_net:
        return "net", None
    if dag_id in loop.info and dag_id in loop.picked:
        return "next loop", None
    if dag_id in loop.swept:
        return "next sweep", None
    return None, "no_slot" if dag_id in loop.info else "not_queued"


def explain(
    session: Session,
    dag_id: str,
    *,
    runs: int = 10,
    loop: LoopSelection | None = None,
    events_per_run: int | None = None,
) -> dict[str, Any]:
    """
    The explanation of ``dag_id`` as a JSON-able dict (``SCHEMA``); ExplainError for bad input.

    ``events_per_run``: read at most that many events of each shown run (its lowest ids), and of the
    pending and dated-ahead ones (their first), and give each run its ``events_total`` and those
    lists theirs (the web page: a run may consume 50 000). None: all.
    """
    from airflow.models.dagrun import DagRun
    from airflow.models.dataset import DagScheduleDatasetReference, DatasetDagRunQueue, DatasetEvent
    from airflow.timetables.simple import DatasetTriggeredTimetable
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType

    from airflow_dataset_race_fix.diagnostics import invariant

    dag_model = _dag_or_error(session, dag_id)
    loop = loop or LoopSelection(session)
    runner, manager_class = loop.runner, loop.manager_class
    dag = runner.dagbag.get_dag(dag_id, session=session)
    if dag is None:
        raise ExplainError(f"DAG {dag_id!r} has no serialized version yet (not parsed since it was added)")
    if not isinstance(dag.timetable, DatasetTriggeredTimetable):
        raise ExplainError(
            f"DAG {dag_id!r} is not dataset-scheduled (its timetable is {dag.timetable.summary!r}); "
            "explain answers for DAGs scheduled on datasets"
        )

    # Decided as the loop decides it; a DAG the loop would not pick is decided as if it
    # were (its queue dates, if any, and otherwise no date beyond its events').
    info = dict(loop.info)
    info.setdefault(dag_id, (_EPOCH, _EPOCH))
    (decision,), _ = runner._decide_dataset_triggered_runs([dag_model], info, session)
    now = manager_class._database_now(session)
    # The net's findings (kept in the log table until consumed): a late commit below its latest
    # run that the next loop's floors do not read. Found, its decision reads from there.
    late_found = dag_id in runner._dags_with_stranded_dataset_events(session)
    by_net = False
    if late_found:
        (with_net,), _ = runner._decide_dataset_triggered_runs([dag_model], info, session)
        by_net = with_net.execution_date is not None and not (
            decision.execution_date is not None and when_it_runs(dag_id, loop)[0]
        )
        if by_net or decision.execution_date is None:
            decision = with_net

    dataset_ids = set(
        session.scalars(
            select(DagScheduleDatasetReference.dataset_id).where(DagScheduleDatasetReference.dag_id == dag_id)
        )
    )
    queued = dict(
        session.execute(
            select(DatasetDagRunQueue.dataset_id, DatasetDagRunQueue.created_at).where(
                DatasetDagRunQueue.target_dag_id == dag_id
            )
        ).all()
    )
    dataset_ids |= queued.keys()
    uris = dataset_uris(session, dataset_ids)
    # The decision reads the columns it decides by; an event is shown as Airflow's whole row (its
    # ``extra``): below.
    choice = decision.choice
    events, deferred = (choice.events, choice.deferred) if choice is not None else ([], [])
    tree = condition_tree(
        dag.timetable.dataset_condition, {uris[e.dataset_id] for e in events if e.dataset_id in uris}
    )

    datasets = []
    for dataset_id in sorted(dataset_ids, key=lambda i: uris.get(i, "")):
        newest = session.scalars(
            select(DatasetEvent)
            .where(DatasetEvent.dataset_id == dataset_id)
            .order_by(DatasetEvent.timestamp.desc())
            .limit(1)
        ).first()
        datasets.append(
            {
                "id": dataset_id,
                "uri": uris.get(dataset_id, f"dataset #{dataset_id}"),
                "queue_row_created_at": _iso(queued.get(dataset_id)),
                "newest_event": _event(newest, uris) if newest is not None else None,
                "pending_event_ids": [e.id for e in events if e.dataset_id == dataset_id],
                "deferred_event_ids": [e.id for e in deferred if e.dataset_id == dataset_id],
            }
        )

    active_runs = session.scalar(
        select(func.count()).where(
            DagRun.dag_id == dag_id, DagRun.state.in_((DagRunState.QUEUED, DagRunState.RUNNING))
        )
    )
    # The audit covers the span of the runs shown (and a look-back before the oldest), so that
    # explain stays bounded on a long history; 'audit --dag-id' covers all of it.
    shown = session.scalars(
        select(DagRun.execution_date)
        .where(DagRun.dag_id == dag_id, DagRun.run_type == DagRunType.DATASET_TRIGGERED)
        .order_by(DagRun.execution_date.desc())
        .limit(max(runs, 1))
    ).all()
    since = None
    if len(shown) == max(runs, 1):
        since = shown[-1] - timedelta(
            seconds=manager_class._dataset_race_fix_setting("event_lookback_seconds")
        )
    found = invariant.audit(session, [dag_id], since=since)
    report = found.report.by_dag().get(dag_id)
    reasons = _reasons(dag_model, active_runs, decision, tree, deferred)
    when = None
    if decision.execution_date is not None and not reasons:
        when, code = when_it_runs(dag_id, loop, by_net)
        if code is not None:
            reasons.append({"code": code, "message": _NOT_THIS_LOOP[code].format(slots=len(loop.picked))})
    verdict = {
        "creates_run": when is not None,
        "when": when,
        "run": None
        if decision.execution_date is None
        else {
            "logical_date": _iso(decision.execution_date),
            "data_interval": [_iso(decision.data_interval.start), _iso(decision.data_interval.end)],
            "run_id": decision.run_id,
            "event_ids": [e.id for e in events],
        },
        "reasons": reasons,
        "notes": _beyond_reach(found, events, uris),
        "read": "from the late commit's stamp: the net found a late commit for this DAG"
        if late_found
        else "each dataset from the newest event its latest run consumed, minus commit_latency_seconds "
        "(a running scheduler's next loop; the net found no late commit)",
    }
    if any(reason["code"] == "not_queued" for reason in reasons):
        events = []  # no run takes them: they stay audit's findings, never "pending"
        for dataset in datasets:
            dataset["pending_event_ids"] = []
    # audit's findings for the DAG (its lists are complete: no limit), but for suspected-lost events
    # its next run takes
    pending_ids = {e.id for e in events}
    rows = {
        name: [
            i.run_id if hasattr(i, "run_id") else i.event_id
            for i in getattr(found, name)
            if not (name == "suspected_lost" and i.event_id in pending_ids)
        ]
        for name in invariant.FINDINGS
        if name != "not_queued_unpaused"  # a count: the verdict tells of those
    }
    return {
        "schema": SCHEMA,
        "dag_id": dag_id,
        "database_now": _iso(now),
        "dag": {
            "is_paused": bool(dag_model.is_paused),
            "is_active": bool(dag_model.is_active),
            "has_import_errors": bool(dag_model.has_import_errors),
            "max_active_runs": dag_model.max_active_runs,
            "active_runs": active_runs,
        },
        "condition": tree,
        "datasets": datasets,
        "verdict": verdict,
        "pending_events": _rows(runner, events[:events_per_run], uris, session),
        "deferred_events": _rows(runner, deferred[:events_per_run], uris, session),
        **(
            {"pending_events_total": len(events), "deferred_events_total": len(deferred)}
            if events_per_run is not None
            else {}
        ),
        "runs": _last_runs(session, dag_id, runs, uris, found, events_per_run),
        "audit": {
            "since": _iso(since),
            "counts": {k: v for k, v in asdict(report).items() if k != "dag_id"}
            if report is not None
            else {},
            "findings": {name: len(ids) for name, ids in rows.items() if ids},
            "rows": {name: ids for name, ids in rows.items() if ids},  # the runs' ids, the events' ids
            "stranded": [
                {
                    "dataset_uri": g.dataset_uri,
                    "events": g.events,
                    "oldest": _iso(g.oldest),
                    "newest": _iso(g.newest),
                }
                for g in found.stranded
            ],
        },
    }


def _rows(runner, events: list, uris: dict[int, str], session: Session) -> list[dict[str, Any]]:
    return [_event(e, uris) for e in runner._dataset_events_by_id([e.id for e in events], session)]


def _reasons(dag_model, active_runs, decision, tree, deferred) -> list[dict[str, str]]:
    """Why the DAG waits, each a stable ``code`` and a message; empty when nothing holds it."""
    reasons = []

    def add(code: str, message: str) -> None:
        reasons.append({"code": code, "message": message})

    if dag_model.is_paused:
        add("paused", "the DAG is paused")
    if not dag_model.is_active:
        add("inactive", "the DAG is not active (its file is gone, or it was deleted)")
    if dag_model.has_import_errors:
        add("import_errors", "the DAG's file has import errors")
    if active_runs >= dag_model.max_active_runs:
        add(
            "max_active_runs",
            f"{active_runs} runs are queued or running, max_active_runs is {dag_model.max_active_runs}",
        )
    if decision.skipped:
        add("skipped", f"the scheduler skips it: {decision.skipped}")
    elif decision.execution_date is None:
        if decision.choice is None or not decision.choice.events:
            add("no_events", "no event that its runs have not consumed yet")
        else:
            add("condition_not_met", "its dataset condition waits for: " + _waiting_for(tree))
    if deferred:
        add(
            "deferred",
            f"{len(deferred)} event(s) dated up to {_iso(max(e.timestamp for e in deferred))}, "
            "beyond the database's clock plus [dataset_race_fix] max_event_ahead_seconds: they "
            "wait until the clock gets there",
        )
    return reasons


def _beyond_reach(found, events, uris) -> list[dict[str, str]]:
    """Notes: events no run consumed that the next run does not take either (audit's stranded groups)."""
    notes = []
    for group in found.stranded:
        pending = sum(1 for e in events if uris.get(e.dataset_id) == group.dataset_uri)
        if group.events > pending:
            notes.append(
                {
                    "code": "beyond_reach",
                    "message": f"{group.events - pending} event(s) of {group.dataset_uri} between "
                    f"{_iso(group.oldest)} and {_iso(group.newest)} were consumed by no run and the next run "
                    "does not take them: 'airflow-dataset-race-fix audit --requeue' gives them to the DAG",
                }
            )
    return notes


def _last_runs(
    session: Session, dag_id: str, limit: int, uris: dict[int, str], found, events_per_run: int | None = None
) -> list[dict[str, Any]]:
    """The DAG's last ``limit`` dataset-triggered runs, newest first, with their events and flags
    (at most ``events_per_run`` events of each, and then each run's ``events_total``)."""
    from airflow.models.dagrun import DagRun
    from airflow.models.dataset import DatasetEvent, association_table
    from airflow.utils.types import DagRunType

    rows = session.execute(
        select(
            DagRun.id,
            DagRun.run_id,
            DagRun.execution_date,
            DagRun.data_interval_start,
            DagRun.data_interval_end,
            DagRun.state,
        )
        .where(DagRun.dag_id == dag_id, DagRun.run_type == DagRunType.DATASET_TRIGGERED)
        .order_by(DagRun.execution_date.desc())
        .limit(limit + 1)  # and the one before the oldest shown: its date tells late events
    ).all()
    events_of: dict[int, list] = {row.id: [] for row in rows[:limit]}  # the one before: its date only
    totals: dict[int, int] = {}
    if events_of and events_per_run is not None:
        # Index-only reads of the association's primary key (dag_run_id, event_id), whatever the
        # statistics: a count per run, and each run's first ids; then those events by id.
        totals = dict(
            session.execute(
                select(association_table.c.dag_run_id, func.count())
                .where(association_table.c.dag_run_id.in_(list(events_of)))
                .group_by(association_table.c.dag_run_id)
            ).all()
        )
        wanted: dict[int, int] = {}
        for run_id in events_of:
            for event_id in session.scalars(
                select(association_table.c.event_id)
                .where(association_table.c.dag_run_id == run_id)
                .order_by(association_table.c.event_id)
                .limit(events_per_run)
            ):
                wanted[event_id] = run_id
        if wanted:
            for event in session.scalars(
                select(DatasetEvent).where(DatasetEvent.id.in_(list(wanted))).order_by(DatasetEvent.timestamp)
            ):
                events_of[wanted[event.id]].append(event)
    elif events_of:
        for run_id, event in session.execute(
            select(association_table.c.dag_run_id, DatasetEvent)
            .join(DatasetEvent, DatasetEvent.id == association_table.c.event_id)
            .where(association_table.c.dag_run_id.in_(list(events_of)))
            .order_by(DatasetEvent.timestamp)
        ):
            events_of[run_id].append(event)
    missing = {e.dataset_id for evs in events_of.values() for e in evs} - uris.keys()
    uris = {**uris, **dataset_uris(session, missing)} if missing else uris
    doubled = {f.event_id for f in found.doubled if f.dag_id == dag_id}
    out_of_order = {f.run_id for f in found.out_of_order if f.dag_id == dag_id}
    result = []
    for index, row in enumerate(rows[:limit]):
        previous = rows[index + 1].execution_date if index + 1 < len(rows) else None
        run_events = events_of[row.id]
        result.append(
            {
                "run_id": row.run_id,
                "logical_date": _iso(row.execution_date),
                "data_interval": [_iso(row.data_interval_start), _iso(row.data_interval_end)],
                "state": row.state,
                "events": [
                    {
                        **_event(e, uris),
                        "late": previous is not None and e.timestamp <= previous,
                        "doubled": e.id in doubled,
                    }
                    for e in run_events
                ],
                "empty": not run_events,
                "out_of_order": row.run_id in out_of_order,
                **({"events_total": totals.get(row.id, 0)} if events_per_run is not None else {}),
            }
        )
    return result
