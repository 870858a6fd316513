"""
The list page's rows (Browse > Dataset runs), for many DAGs at once: counts, not rows.

``explain`` answers for one DAG with everything (its runs, their events, an audit of their
span); the list needs per DAG its verdict, reason codes, pending and dated-ahead counts,
paused, and audit's finding counts. Here the fixed scheduler's decision runs once for all
the DAGs asked for (``_decide_dataset_triggered_runs`` takes many DAGs, as in a scheduler
loop), and audit's counts (``invariant.check``) once per batch of DAGs, over the look-back
window; no run's events are read. The verdict is explain's: the same decision, explain's
``_reasons``, and ``when`` as explain sets it (tests/test_web.py compares every row with
``explain``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

VERDICTS = {"next loop": "runs next loop", "next sweep": "runs at next sweep"}


def not_explained(dag_id: str, why: str) -> dict[str, Any]:
    return {"dag_id": dag_id, "verdict": "not explained", "reasons": [why], "pending": 0, "deferred": 0,
            "findings": {}, "paused": None}


def rows(session: Session, dag_ids: list[str], loop) -> list[dict[str, Any]]:
    """One row per DAG of ``dag_ids`` (in that order): verdict, reason codes, counts; findings empty (``add_findings``)."""
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.timetables.simple import DatasetTriggeredTimetable
    from airflow.utils.state import DagRunState

    from airflow_dataset_race_fix.diagnostics.explain import _EPOCH, _reasons, condition_tree, when_it_runs

    models: dict[str, Any] = {}
    active: dict[str, int] = {}
    for start in range(0, len(dag_ids), 500):
        chunk = dag_ids[start : start + 500]
        models.update((dm.dag_id, dm) for dm in session.scalars(select(DagModel).where(DagModel.dag_id.in_(chunk))))
        active.update(
            session.execute(
                select(DagRun.dag_id, func.count())
                .where(DagRun.dag_id.in_(chunk), DagRun.state.in_((DagRunState.QUEUED, DagRunState.RUNNING)))
                .group_by(DagRun.dag_id)
            ).all()
        )
    found: dict[str, dict[str, Any]] = {}
    decided = []
    for dag_id in dag_ids:  # what explain refuses, the list says so
        dag = loop.runner.dagbag.get_dag(dag_id, session=session) if dag_id in models else None
        if dag_id not in models:
            found[dag_id] = not_explained(dag_id, "no such DAG in the metadata database")
        elif dag is None:
            found[dag_id] = not_explained(dag_id, "no serialized version yet")
        elif not isinstance(dag.timetable, DatasetTriggeredTimetable):
            found[dag_id] = not_explained(dag_id, "not dataset-scheduled")
        else:
            decided.append(models[dag_id])
    info = dict(loop.info)
    for dag_model in decided:  # decided as explain decides a DAG the loop would not pick
        info.setdefault(dag_model.dag_id, (_EPOCH, _EPOCH))
    decisions, _ = loop.runner._decide_dataset_triggered_runs(decided, info, session) if decided else ([], [])
    for decision in decisions:
        dag_id = decision["dag_id"]
        dag_model, events, deferred = models[dag_id], decision.get("events") or [], decision.get("deferred") or []
        dag = decision.get("dag") or loop.runner.dagbag.get_dag(dag_id, session=session)
        tree = condition_tree(dag.timetable.dataset_condition, _uris_with_events(session, events))
        codes = [r["code"] for r in _reasons(dag_model, active.get(dag_id, 0), decision, tree, deferred)]
        when = None
        if decision.get("run") is not None and not codes:  # as explain() sets ``when``
            when, code = when_it_runs(dag_id, loop)
            codes += [code] if code else []
        found[dag_id] = {
            "dag_id": dag_id, "verdict": VERDICTS.get(when, "waits"), "reasons": codes, "pending": len(events),
            "deferred": len(deferred), "findings": {}, "paused": bool(dag_model.is_paused),
            "_late": [e.timestamp for e in decision.get("late") or []],
        }
    return [found[dag_id] for dag_id in dag_ids]


_URI_CACHE_KEY = "_adrf_dataset_uris"


def _uris_with_events(session: Session, events: list) -> set[str]:
    """The URIs of the datasets that have events among ``events`` (the condition's ``met``)."""
    from airflow_dataset_race_fix.diagnostics.explain import dataset_uris

    ids = {e.dataset_id for e in events}
    if not ids:
        return set()
    cache: dict[int, str] = session.info.setdefault(_URI_CACHE_KEY, {})
    missing = sorted(ids - cache.keys())
    if missing:
        cache.update(dataset_uris(session, missing))
    return {cache[i] for i in ids if i in cache}


def add_findings(session: Session, found: list[dict[str, Any]], now) -> None:
    """
    audit's finding counts of each row's DAG over the look-back window (``event_lookback_seconds``
    before the database's clock), batched as ``invariant.check`` batches; suspected-lost events
    that the DAG's next run takes (pending) are not counted, as on the DAG page.
    """
    from airflow_dataset_race_fix.diagnostics import invariant
    from airflow_dataset_race_fix.fix.datasets.manager import DatasetManager

    since = now - timedelta(seconds=DatasetManager._dataset_race_fix_setting("event_lookback_seconds"))
    explained = [row for row in found if row["verdict"] != "not explained"]
    if not explained:
        return
    by_dag = invariant.check_window(session, [row["dag_id"] for row in explained], since=since).by_dag()
    for row in explained:
        report = by_dag.get(row["dag_id"])
        findings = dict(report.findings()) if report is not None else {}
        taken = sum(1 for t in row["_late"] if t >= since)
        if taken and findings.get("suspected_lost"):
            findings["suspected_lost"] = max(0, findings["suspected_lost"] - taken)
            if not findings["suspected_lost"]:
                del findings["suspected_lost"]
        row["findings"] = findings
