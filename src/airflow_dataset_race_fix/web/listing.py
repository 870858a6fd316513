"""
The list page's rows (Browse > Dataset runs), for many DAGs at once: counts, not rows.

``explain`` answers for one DAG with everything (its runs, their events, an audit of their
span); the list needs per DAG its verdict, reason codes, pending and dated-ahead counts,
paused, and audit's finding counts. Here the fixed scheduler's decision runs once for the DAGs
that ran (``_decide_dataset_triggered_runs`` takes many, as a loop does); for those with no run yet, its
choice (``_choose_dataset_run``) on their datasets' event counts, not their events (``_first_runs``);
audit's counts once per batch of DAGs, over the look-back window. The verdict is explain's: the same
decision, explain's ``_reasons``, and ``when`` as explain sets it (tests/test_web.py compares every row
with ``explain``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Collection

from sqlalchemy import func, select
from sqlalchemy.orm import Session

VERDICTS = {"next loop": "runs next loop", "next sweep": "runs at next sweep"}


def _chunks(items: list) -> Any:
    """``items`` 500 at a time: an IN list's bound variables (SQLite before 3.32 takes 999)."""
    return (items[start : start + 500] for start in range(0, len(items), 500))


def not_explained(dag_id: str, why: str) -> dict[str, Any]:
    return {
        "dag_id": dag_id,
        "verdict": "not explained",
        "reasons": [why],
        "pending": 0,
        "deferred": 0,
        "findings": {},
        "paused": None,
    }


def rows(session: Session, dag_ids: list[str], loop) -> list[dict[str, Any]]:
    """A row per DAG of ``dag_ids`` (in that order): verdict, reason codes, counts; no findings
    (``add_findings``)."""
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.timetables.simple import DatasetTriggeredTimetable
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType

    from airflow_dataset_race_fix.diagnostics.explain import _EPOCH, _reasons, condition_tree, when_it_runs

    models, active, ran = (
        {},
        {},
        set(),
    )  # DAG models; queued or running runs; DAGs with a dataset-triggered run
    for chunk in _chunks(dag_ids):
        models.update(
            (dm.dag_id, dm) for dm in session.scalars(select(DagModel).where(DagModel.dag_id.in_(chunk)))
        )
        runs = select(DagRun.dag_id).where(DagRun.dag_id.in_(chunk))
        active.update(
            session.execute(
                runs.add_columns(func.count())
                .where(DagRun.state.in_((DagRunState.QUEUED, DagRunState.RUNNING)))
                .group_by(DagRun.dag_id)
            ).all()
        )
        ran.update(session.scalars(runs.where(DagRun.run_type == DagRunType.DATASET_TRIGGERED).distinct()))
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
    first, others = [dm for dm in decided if dm.dag_id not in ran], [dm for dm in decided if dm.dag_id in ran]
    decisions = (_first_runs(session, first, info, loop) if first else []) + (
        loop.runner._decide_dataset_triggered_runs(others, info, session)[0] if others else []
    )  # the fix's decision
    for decision in decisions:
        dag_id = decision.dag_id
        choice, dag_model = decision.choice, models[dag_id]
        events, deferred = (choice.events, choice.deferred) if choice is not None else ([], [])
        dag = decision.dag or loop.runner.dagbag.get_dag(dag_id, session=session)
        met = set(_uris(session, {e.dataset_id for e in events}).values())  # the datasets with events
        tree = condition_tree(dag.timetable.dataset_condition, met)
        codes = [r["code"] for r in _reasons(dag_model, active.get(dag_id, 0), decision, tree, deferred)]
        when = None
        if decision.execution_date is not None and not codes:  # as explain() sets ``when``
            when, code = when_it_runs(dag_id, loop)
            codes += [code] if code else []
        found[dag_id] = {
            "dag_id": dag_id,
            "verdict": VERDICTS.get(when, "waits"),
            "reasons": codes,
            "pending": len(events),
            "deferred": len(deferred),
            "findings": {},
            "paused": bool(dag_model.is_paused),
            "_late": [e.timestamp for e in choice.late] if choice is not None else [],
        }
    return [found[dag_id] for dag_id in dag_ids]


def _first_runs(session: Session, dag_models: list, info: dict, loop) -> list:
    """
    The decisions of DAGs with no dataset-triggered run yet, from counts, not rows (50 000 events took 0.2 s
    to read). A first run reads every event of the DAG's datasets (``_dataset_floors``): each dataset's events
    up to the horizon, and beyond it, stand as one event (its newest) repeated as many times as they are, and
    the fixed scheduler's own choice (``_choose_dataset_run``) decides on them. All the list shows of the run:
    that there is one.
    """
    from airflow.models.dataset import (
        DagScheduleDatasetReference as ref,
    )
    from airflow.models.dataset import (
        DatasetDagRunQueue as queue,
    )
    from airflow.models.dataset import (
        DatasetEvent,
    )

    runner, manager, ids = loop.runner, loop.manager_class, [dm.dag_id for dm in dag_models]
    ahead = timedelta(seconds=manager._dataset_race_fix_setting("max_event_ahead_seconds"))
    horizon = manager._database_now(session) + ahead  # as the fixed scheduler's decision reads it
    queued, datasets = (
        {dag_id: {} for dag_id in ids},
        {dag_id: set() for dag_id in ids},
    )  # scheduled on, or queued
    for chunk in _chunks(ids):
        rows_of = select(queue.target_dag_id, queue.dataset_id, queue.created_at).where(
            queue.target_dag_id.in_(chunk)
        )
        for dag_id, dataset_id, created_at in session.execute(rows_of):
            queued[dag_id][dataset_id] = created_at
            datasets[dag_id].add(dataset_id)
        for dag_id, dataset_id in session.execute(
            select(ref.dag_id, ref.dataset_id).where(ref.dag_id.in_(chunk))
        ):
            datasets[dag_id].add(dataset_id)
    every, event = sorted(set().union(*datasets.values())), DatasetEvent
    standing: dict[int, list] = {dataset_id: [] for dataset_id in every}
    counts = select(event.dataset_id, func.count(), func.max(event.timestamp)).group_by(event.dataset_id)
    for chunk in _chunks(every):
        for dated in (event.timestamp <= horizon, event.timestamp > horizon):  # up to the horizon, and beyond
            for dataset_id, count, newest in session.execute(
                counts.where(event.dataset_id.in_(chunk), dated)
            ):
                standing[dataset_id] += [
                    runner._DatasetEventRead(None, dataset_id, newest, None, None)
                ] * int(count)
    uris, decisions = _uris(session, every), []
    for dag_model in dag_models:
        dag, dag_id = runner.dagbag.get_dag(dag_model.dag_id, session=session), dag_model.dag_id
        choice = runner._choose_dataset_run(
            [e for dataset_id in sorted(datasets[dag_id]) for e in standing[dataset_id]],
            horizon,
            None,
            info[dag_id][1],
            queued[dag_id],
            uris,
            lambda statuses: dag.timetable.dataset_condition.evaluate(statuses),
        )
        skipped = "serialized before Airflow 2.9" if choice.old_serialization else None
        # a run's date before the unique-date check: the list shows that there is one, not its date or id
        decision = runner._DatasetDecision(dag_id, dag, choice, skipped=skipped)
        decision.execution_date = choice.execution_date
        decisions.append(decision)
    return decisions


_URI_CACHE_KEY = "_adrf_dataset_uris"


def _uris(session: Session, ids: Collection[int]) -> dict[int, str]:
    """The URIs of the datasets ``ids`` (those that exist), kept in the session for the request."""
    from airflow_dataset_race_fix.diagnostics.explain import dataset_uris

    cache: dict[int, str] = session.info.setdefault(_URI_CACHE_KEY, {})
    missing = sorted(ids - cache.keys())
    if missing:
        cache.update(dataset_uris(session, missing))
    return {i: cache[i] for i in ids if i in cache}


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
        findings.pop("not_queued_unpaused", None)  # as on the DAG page: its verdict tells of those events
        taken = sum(1 for t in row["_late"] if t >= since)
        if taken and findings.get("suspected_lost"):
            findings["suspected_lost"] = max(0, findings["suspected_lost"] - taken)
            if not findings["suspected_lost"]:
                del findings["suspected_lost"]
        row["findings"] = findings
