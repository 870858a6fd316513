"""
The web page (Browse > Dataset runs): ``explain`` for every dataset-triggered DAG the user may read.

Read-only: each request reads in a transaction of its own (``READ ONLY`` on PostgreSQL and
MySQL) that is rolled back; any action (``audit --requeue``) stays in the CLI. Airflow's
RBAC: the page needs access to the website, and each DAG its ``can_read`` (DAG-level
permissions included); a DAG the user may not read is answered 404, page and JSON alike,
so its existence is not told either. Templates are Jinja with autoescape: DAG ids, dataset
URIs and event ``extra`` render as text.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from flask import Response, abort, g, request
from flask_appbuilder import BaseView, expose

from airflow.www.auth import has_access_view

PAGE_SIZE = 50


@contextlib.contextmanager
def _read_only_session():
    from sqlalchemy import text

    from airflow import settings

    session = settings.Session.session_factory()
    try:
        if session.bind.dialect.name in ("postgresql", "mysql"):
            session.execute(text("SET TRANSACTION READ ONLY"))
        yield session
    finally:
        session.rollback()
        session.close()


def _permitted(dag_ids: list[str]) -> list[str]:
    from airflow.www.extensions.init_auth_manager import get_auth_manager

    allowed = get_auth_manager().get_permitted_dag_ids(methods=["GET"], user=g.user)
    return [dag_id for dag_id in dag_ids if dag_id in allowed]


def _fix_active() -> bool:
    from airflow_dataset_race_fix.commands.explain import fix_active_here

    return fix_active_here()


def _summary(found: dict[str, Any]) -> dict[str, Any]:
    verdict = found["verdict"]
    return {
        "dag_id": found["dag_id"],
        "verdict": {"next loop": "runs next loop", "next sweep": "runs at next sweep"}.get(verdict["when"], "waits"),
        "reasons": [r["code"] for r in verdict["reasons"]],
        "pending": len(found["pending_events"]),
        "deferred": len(found["deferred_events"]),
        "findings": found["audit"]["findings"],
        "paused": found["dag"]["is_paused"],
    }


class DatasetRunsView(BaseView):
    """Browse > Dataset runs."""

    route_base = "/dataset-race-fix"
    default_view = "dags"
    template_folder = os.path.join(os.path.dirname(__file__), "templates")

    @expose("/")
    @has_access_view()
    def dags(self):
        from airflow_dataset_race_fix import invariant
        from airflow_dataset_race_fix.explain import ExplainError, LoopSelection, explain

        text_filter = request.args.get("filter", "").strip()
        verdict_filter = request.args.get("verdict", "")
        sort = request.args.get("sort", "dag_id")
        page = max(1, request.args.get("page", 1, type=int))
        with _read_only_session() as session:
            dag_ids = _permitted(invariant.consuming_dag_ids(session))
            if text_filter:
                dag_ids = [dag_id for dag_id in dag_ids if text_filter.lower() in dag_id.lower()]
            total = len(dag_ids)
            rows = []
            loop = LoopSelection(session)  # read once for the page
            for dag_id in dag_ids[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]:
                try:
                    rows.append(_summary(explain(session, dag_id, runs=1, loop=loop)))
                except ExplainError as err:
                    rows.append({"dag_id": dag_id, "verdict": "not explained", "reasons": [str(err)], "pending": 0,
                                 "deferred": 0, "findings": {}, "paused": None})
        if verdict_filter in ("runs", "waits"):
            rows = [r for r in rows if r["verdict"].startswith(verdict_filter)]
        key = {
            "verdict": lambda r: (r["verdict"], r["dag_id"]),
            "findings": lambda r: (-sum(r["findings"].values()), r["dag_id"]),
            "pending": lambda r: (-r["pending"], r["dag_id"]),
        }.get(sort, lambda r: r["dag_id"])
        rows.sort(key=key)
        return self.render_template(
            "dataset_race_fix/dags.html",
            rows=rows,
            total=total,
            page=page,
            pages=max(1, -(-total // PAGE_SIZE)),
            text_filter=text_filter,
            verdict_filter=verdict_filter,
            sort=sort,
            fix_active=_fix_active(),
        )

    def _explained(self, dag_id: str) -> dict[str, Any]:
        from airflow_dataset_race_fix.explain import ExplainError, explain

        if not _permitted([dag_id]):
            abort(404)
        runs = min(max(request.args.get("runs", 10, type=int), 0), 100)
        with _read_only_session() as session:
            try:
                found = explain(session, dag_id, runs=runs)
            except ExplainError as err:
                abort(404, description=str(err))
        found["fix"] = {"active_in_this_process": _fix_active()}
        return found

    @expose("/dag/<string:dag_id>")
    @has_access_view()
    def dag(self, dag_id: str):
        from airflow_dataset_race_fix.web import timeline

        found = self._explained(dag_id)
        return self.render_template("dataset_race_fix/dag.html", found=found, svg=timeline.render(found))

    @expose("/dag/<string:dag_id>/json")
    @has_access_view()
    def dag_json(self, dag_id: str):
        return Response(json.dumps(self._explained(dag_id), indent=2), mimetype="application/json")
