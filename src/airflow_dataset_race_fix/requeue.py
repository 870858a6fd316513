"""
``audit --requeue`` (docs/audit.md, "Recovery"): per (DAG, dataset) with stranded events, a
queue row dated at or before the oldest of them (inserted, or created_at lowered, never
raised), in one transaction in the scheduler's lock order; no event or run is touched.

Why that is enough with the fixed scheduler: it takes a DAG's unconsumed events from
``min(latest run's date, oldest queue row read) - lookback``, so the lowered created_at brings
in every stranded event, none twice; and it deletes queue rows only *as read* (key and
created_at), so a row lowered after a scheduler read it survives for its next loop. The stock
scheduler would take the window ``(run before the row, max(created_at)]`` and create a run
dated in the past (S6): hence the refusal unless the fix is active in this interpreter.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from airflow_dataset_race_fix.diagnostics.invariant import StrandedGroup
from airflow_dataset_race_fix.targets import SCHEDULER_MODULE

INSERT, LOWER, KEEP = "insert", "lower", "keep"


class RequeueRefused(RuntimeError):
    """The requeue cannot or must not write; the message says why, in one line."""


@dataclass
class QueueWrite:
    dag_id: str
    dataset_id: int
    dataset_uri: str
    events: int
    created_at: datetime  # the created_at the row must have at most: the oldest stranded event
    current: datetime | None  # the row's created_at when audited, None if missing
    action: str  # insert, lower or keep


def plan(groups: list[StrandedGroup]) -> list[QueueWrite]:
    return [
        QueueWrite(
            g.dag_id,
            g.dataset_id,
            g.dataset_uri,
            g.events,
            g.oldest,
            g.queued_at,
            INSERT if g.queued_at is None else LOWER if g.queued_at > g.oldest else KEEP,
        )
        for g in groups
    ]


def ensure_fix_active() -> str:
    """
    Refuse unless this interpreter runs the fixed scheduler (shim active, or source patched).
    Not ``apply()``: it would succeed here and say nothing about where the scheduler runs.
    """
    from airflow_dataset_race_fix import runtime
    from airflow_dataset_race_fix.diagnostics import fix_active_here

    if fix_active_here():  # imports the scheduler module: the shim's post-import hook patches it here
        return runtime.module_state(SCHEDULER_MODULE).state
    state = runtime.module_state(SCHEDULER_MODULE)
    raise RequeueRefused(
        f"refusing to requeue: the fix is not active in this interpreter ({SCHEDULER_MODULE}: "
        f"{state.state}{', ' + state.detail if state.detail else ''}). Requeued events reach their "
        "consumers only through the fixed scheduler; run this where the scheduler runs, with the "
        "shim active (PYTHONPATH=$(airflow-dataset-race-fix shim path) or "
        "'airflow-dataset-race-fix shim install-pth') or the source patches applied"
    )


def apply(engine: Engine, writes: list[QueueWrite]) -> int:
    """Write the rows that need it, in one transaction; returns how many were written."""
    rows = [
        {"dataset_id": w.dataset_id, "target_dag_id": w.dag_id, "created_at": w.created_at}
        for w in sorted(writes, key=lambda w: (w.dataset_id, w.dag_id))  # the scheduler's lock order
        if w.action != KEEP
    ]
    if not rows:
        return 0
    try:
        with Session(bind=engine) as session, session.begin():
            session.execute(_upsert(engine.dialect.name), rows)
    except DBAPIError as err:
        raise RequeueRefused(_explain(err)) from None
    return len(rows)


def _upsert(dialect: str):
    """
    Insert the row, or lower an existing row's created_at; never raise it. The upsert (not a
    read then a write) keeps a producer that inserts the same key meanwhile from failing us.
    """
    from airflow.models.dataset import DatasetDagRunQueue

    table = DatasetDagRunQueue.__table__
    keys = [table.c.dataset_id, table.c.target_dag_id]
    if dialect in ("postgresql", "sqlite"):
        stmt = importlib.import_module(f"sqlalchemy.dialects.{dialect}").insert(table)
        return stmt.on_conflict_do_update(
            index_elements=keys,
            set_={"created_at": stmt.excluded.created_at},
            where=table.c.created_at > stmt.excluded.created_at,
        )
    if dialect == "mysql":
        from sqlalchemy.dialects.mysql import insert

        stmt = insert(table)
        return stmt.on_duplicate_key_update(
            created_at=func.least(table.c.created_at, stmt.inserted.created_at)
        )
    raise RequeueRefused(f"refusing to requeue: unsupported database dialect {dialect!r}")


# Errors meaning "this user or connection may not write": PostgreSQL SQLSTATEs, MySQL errnos.
_PG_READ_ONLY = {"42501", "25006"}  # insufficient_privilege, read_only_sql_transaction
_MYSQL_READ_ONLY = {1142, 1044, 1290, 1792}  # command denied, access denied, --read-only, read-only trx


def _explain(err: DBAPIError) -> str:
    orig = err.orig
    code = getattr(orig, "pgcode", None) or (orig.args[0] if getattr(orig, "args", None) else None)
    first_line = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    read_only = code in _PG_READ_ONLY or code in _MYSQL_READ_ONLY or "readonly database" in first_line
    if read_only:
        return (
            "refusing to requeue: this database user cannot write dataset_dag_run_queue "
            f"({first_line}); nothing was changed. The audit itself needs only SELECT; "
            "requeue needs INSERT and UPDATE on dataset_dag_run_queue"
        )
    return f"requeue failed, nothing was changed: {type(orig).__name__}: {first_line}"


__all__ = ["INSERT", "KEEP", "LOWER", "QueueWrite", "RequeueRefused", "apply", "ensure_fix_active", "plan"]
