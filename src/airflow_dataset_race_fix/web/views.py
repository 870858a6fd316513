"""
The web page (Browse > Dataset runs): ``explain`` for every dataset-triggered DAG the user may read.

What it shows, its RBAC and its costs: docs/explain.md, "The page in Airflow's UI". Read-only
(a rolled-back transaction per request, ``READ ONLY`` on PostgreSQL and MySQL); a DAG the user
may not read is a 404 so its existence is not told; Jinja autoescape renders DAG ids, URIs and
``extra`` as text.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
from typing import Any

from airflow.www.auth import has_access_view
from flask import Response, abort, current_app, g, request, url_for
from flask_appbuilder import BaseView, expose
from sqlalchemy import select

from airflow_dataset_race_fix.diagnostics import fix_active_here

PAGE_SIZE = 50
# Events of one kind (pending; each run's) on the DAG page and in its JSON; the rest through 'more'
EVENTS_SHOWN = 100


@contextlib.contextmanager
def _read_only_session():
    from airflow import settings
    from sqlalchemy import text

    session = settings.Session.session_factory()
    # No cycle collection while a request reads: its full passes over the webserver's objects, every
    # few thousand rows read, took 0.1-0.2 s of a list; what the request leaves is collected after it.
    collecting = gc.isenabled()
    gc.disable()
    try:
        if session.bind.dialect.name in ("postgresql", "mysql"):
            session.execute(text("SET TRANSACTION READ ONLY"))
        if session.bind.dialect.name == "postgresql":
            # The reads are shaped for indexes; statistics behind a bulk load scanned the event
            # table per DAG. No JIT: compiling cost 0.2-0.3 s for statements that ran in 0.1 s.
            session.execute(text("SET LOCAL enable_seqscan = off"))
            session.execute(text("SET LOCAL jit = off"))
        yield session
    finally:
        session.rollback()
        session.close()
        if collecting:
            gc.enable()


class _Access:
    """
    What this user may read, as Airflow's own views and API decide it: the DAGs (``can_read``
    on the DAG, DAG-level permissions included), a DAG's runs (``DagAccessEntity.RUN``, as
    ``/api/v1/dags/<dag>/dagRuns``) and dataset events (``can_read`` on Datasets, as
    ``/api/v1/datasets/events``).
    """

    def __init__(self) -> None:
        from airflow.www.extensions.init_auth_manager import get_auth_manager

        self.manager = get_auth_manager()
        self.dag_ids: set[str] = self.manager.get_permitted_dag_ids(methods=["GET"], user=g.user)

    def runs(self, dag_id: str) -> bool:
        from airflow.auth.managers.models.resource_details import DagAccessEntity, DagDetails

        return self.manager.is_authorized_dag(
            method="GET", access_entity=DagAccessEntity.RUN, details=DagDetails(id=dag_id)
        )

    def events(self) -> bool:
        # The FAB manager's name for it since provider 1.5 (is_authorized_dataset warns there)
        check = getattr(self.manager, "is_authorized_asset", None) or self.manager.is_authorized_dataset
        return check(method="GET")


def _permitted(dag_ids: list[str], access: _Access) -> list[str]:
    return [dag_id for dag_id in dag_ids if dag_id in access.dag_ids]


def _withhold(found: dict[str, Any], access: _Access) -> dict[str, Any]:
    """
    ``found`` without what Airflow would not show this user: dataset events (ids, dates, ``extra``)
    without Datasets, the DAG's runs without DAG Runs, and a producer's DAG, run and task ids
    without read on the producer DAG. What is left out is named in ``withheld``; the verdict
    (its reasons and notes: counts and dates) stays, as the page's purpose.
    """
    withheld: dict[str, str] = {}
    if not access.runs(found["dag_id"]):
        withheld["runs"] = "this DAG's runs: your role lacks can_read on DAG Runs"
        found["runs"] = []
    if not access.events():
        withheld["events"] = "dataset events: your role lacks can_read on Datasets"
        found["pending_events"], found["deferred_events"] = [], []
        for dataset in found["datasets"]:
            dataset["newest_event"] = None
            dataset["pending_event_ids"], dataset["deferred_event_ids"] = [], []
        if found["verdict"]["run"] is not None:
            found["verdict"]["run"]["event_ids"] = []
        found["audit"]["stranded"] = []
        for run in found["runs"]:
            run["events"] = []
    events = (
        found["pending_events"]
        + found["deferred_events"]
        + [e for run in found["runs"] for e in run["events"]]
    )
    events += [d["newest_event"] for d in found["datasets"] if d["newest_event"]]
    if _hide_producers(events, access):
        withheld["producers"] = "the producer's DAG, run and task ids of DAGs your role may not read"
    found["withheld"] = withheld
    return found


def _hide_producers(events: list[dict[str, Any]], access: _Access) -> bool:
    """Blank the producer's ids of events from DAGs this user may not read; whether any was."""
    hidden = [
        e for e in events if e["source_dag_id"] is not None and e["source_dag_id"] not in access.dag_ids
    ]
    for event in hidden:
        event["source_dag_id"] = event["source_run_id"] = event["source_task_id"] = None
    return bool(hidden)


def _capped(found: dict[str, Any], dag_id: str) -> dict[str, Any]:
    """At most ``EVENTS_SHOWN`` pending and dated-ahead events, with their totals and where the rest is."""
    for name in ("pending_events", "deferred_events"):
        total = found.setdefault(f"{name}_total", len(found[name]))
        if total > EVENTS_SHOWN:
            found[name] = found[name][:EVENTS_SHOWN]
            found[f"{name}_more"] = url_for(
                "DatasetRunsView.events", dag_id=dag_id, of=name.split("_")[0], offset=EVENTS_SHOWN
            )
    for run in found["runs"]:
        if run.get("events_total", 0) > len(run["events"]):
            run["events_more"] = url_for(
                "DatasetRunsView.events",
                dag_id=dag_id,
                run_id=run["run_id"],
                after=max(e["id"] for e in run["events"]),
            )
    return found


class DatasetRunsView(BaseView):
    """Browse > Dataset runs."""

    route_base = "/dataset-race-fix"
    default_view = "dags"
    template_folder = os.path.join(os.path.dirname(__file__), "templates")

    @expose("/")
    @has_access_view()
    def dags(self):
        from airflow_dataset_race_fix.diagnostics import invariant
        from airflow_dataset_race_fix.diagnostics.explain import LoopSelection
        from airflow_dataset_race_fix.web import listing

        text_filter = request.args.get("filter", "").strip()
        verdict_filter = request.args.get("verdict", "")
        verdict_filter = verdict_filter if verdict_filter in ("runs", "waits") else ""
        sort = request.args.get("sort", "dag_id")
        page = max(1, request.args.get("page", 1, type=int))
        access = _Access()
        with _read_only_session() as session:
            dag_ids = _permitted(invariant.consuming_dag_ids(session), access)
            if text_filter:
                dag_ids = [dag_id for dag_id in dag_ids if text_filter.lower() in dag_id.lower()]
            loop = LoopSelection(session)  # read once for the request
            # The webserver's DagBag, kept as Airflow's pages keep it: a DAG deserialized when it changes
            if getattr(current_app.dag_bag, "read_dags_from_db", False):
                loop.runner.dagbag = current_app.dag_bag
            now = loop.manager_class._database_now(session)
            # Sorted and filtered over every permitted DAG, then a page of it: the verdicts (one
            # decision for all) when the sort or filter needs them, findings when the sort does;
            # else only the page's DAGs are decided.
            whole = verdict_filter or sort in ("verdict", "pending", "findings")
            rows = listing.rows(session, dag_ids if whole else _page(dag_ids, page), loop)
            if verdict_filter:
                rows = [r for r in rows if r["verdict"].startswith(verdict_filter)]
            if sort == "findings":
                listing.add_findings(session, rows, now)
            key = {
                "verdict": lambda r: (r["verdict"], r["dag_id"]),
                "findings": lambda r: (-sum(r["findings"].values()), r["dag_id"]),
                "pending": lambda r: (-r["pending"], r["dag_id"]),
            }.get(sort, lambda r: r["dag_id"])
            rows.sort(key=key)
            total = len(rows) if whole else len(dag_ids)
            if whole:
                rows = _page(rows, page)
            if sort != "findings":
                listing.add_findings(session, rows, now)
        for row in rows:
            row.pop("_late", None)
        return self.render_template(
            "dataset_race_fix/dags.html",
            rows=rows,
            total=total,
            page=page,
            pages=max(1, -(-total // PAGE_SIZE)),
            text_filter=text_filter,
            verdict_filter=verdict_filter,
            sort=sort,
            fix_active=fix_active_here(),
        )

    def _explained(self, dag_id: str, access: _Access) -> dict[str, Any]:
        from airflow_dataset_race_fix.diagnostics.explain import ExplainError, explain

        if not _permitted([dag_id], access):
            abort(404)
        runs = min(max(request.args.get("runs", 10, type=int), 0), 100)
        with _read_only_session() as session:
            try:
                found = explain(session, dag_id, runs=runs, events_per_run=EVENTS_SHOWN)
            except ExplainError as err:
                abort(404, description=str(err))
        found["fix"] = {"active_in_this_process": fix_active_here()}
        return _capped(_withhold(found, access), dag_id)

    @expose("/dag/<string:dag_id>")
    @has_access_view()
    def dag(self, dag_id: str):
        from airflow_dataset_race_fix.web import timeline

        found = self._explained(dag_id, _Access())
        return self.render_template("dataset_race_fix/dag.html", found=found, svg=timeline.render(found))

    @expose("/dag/<string:dag_id>/json")
    @has_access_view()
    def dag_json(self, dag_id: str):
        return Response(json.dumps(self._explained(dag_id, _Access()), indent=2), mimetype="application/json")

    @expose("/deployment")
    @has_access_view()
    def deployment(self):
        """Which processes ran the fix over the last ``hours`` (``airflow-dataset-race-fix deployment``)."""
        from airflow_dataset_race_fix.diagnostics import deployment

        try:
            hours = deployment.period_hours(request.args.get("hours", "24"))
        except ValueError as err:
            abort(400, description=str(err))
        with _read_only_session() as session:
            found = deployment.collect(session, hours)
        readable = set(
            _permitted(sorted({r["dag_id"] for r in found["producers"] if r["dag_id"]}), _Access())
        )
        found["producers"] = [r for r in found["producers"] if r["dag_id"] is None or r["dag_id"] in readable]
        return self.render_template("dataset_race_fix/deployment.html", found=found, hours=hours)

    @expose("/dag/<string:dag_id>/events")
    @has_access_view()
    def events(self, dag_id: str):
        """The rest of a list of events (JSON): ``of=pending|deferred&offset=N``, or ``run_id=R&after=ID``."""
        from airflow.models.dagrun import DagRun
        from airflow.models.dataset import DatasetEvent, association_table

        from airflow_dataset_race_fix.diagnostics.explain import ExplainError, _event, dataset_uris, explain

        access = _Access()
        if not _permitted([dag_id], access):
            abort(404)
        if not access.events():
            abort(403, description="dataset events: your role lacks can_read on Datasets")
        run_id = request.args.get("run_id")
        with _read_only_session() as session:
            if run_id is None:
                of = request.args.get("of", "pending")
                if of not in ("pending", "deferred"):
                    abort(400)
                offset = max(0, request.args.get("offset", 0, type=int))
                try:
                    found = explain(session, dag_id, runs=0, events_per_run=offset + EVENTS_SHOWN)
                except ExplainError as err:
                    abort(404, description=str(err))
                events = found[f"{of}_events"][offset : offset + EVENTS_SHOWN]
                more = offset + EVENTS_SHOWN < found[f"{of}_events_total"]
                next_args = {"of": of, "offset": offset + EVENTS_SHOWN}
            else:
                if not access.runs(dag_id):
                    abort(403, description="this DAG's runs: your role lacks can_read on DAG Runs")
                after = request.args.get("after", 0, type=int)
                run = session.scalar(
                    select(DagRun.id).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)
                )
                if run is None:
                    abort(404)
                ids = session.scalars(
                    select(association_table.c.event_id)
                    .where(association_table.c.dag_run_id == run, association_table.c.event_id > after)
                    .order_by(association_table.c.event_id)
                    .limit(EVENTS_SHOWN + 1)
                ).all()
                more = len(ids) > EVENTS_SHOWN
                ids = ids[:EVENTS_SHOWN]
                rows = session.scalars(
                    select(DatasetEvent).where(DatasetEvent.id.in_(ids)).order_by(DatasetEvent.id)
                ).all()
                uris = dataset_uris(session, {e.dataset_id for e in rows})
                events = [_event(e, uris) for e in rows]
                next_args = {"run_id": run_id, "after": ids[-1] if ids else after}
        _hide_producers(events, access)
        body = {
            "dag_id": dag_id,
            "events": events,
            "more": url_for("DatasetRunsView.events", dag_id=dag_id, **next_args) if more else None,
        }
        return Response(json.dumps(body, indent=2), mimetype="application/json")


def _page(items: list, page: int) -> list:
    return items[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
