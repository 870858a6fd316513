"""
The invariant checker: what the metadata tables say about dataset-triggered runs.

It reads Airflow's tables only and never imports the fix, so it judges stock and fixed
code alike. The tests, ``reproduce/`` and ``audit`` all use it. Every figure is one
set-based query per DAG batch, so it also runs on large metadata databases.

Per consuming DAG D (a DAG with a ``dag_schedule_dataset_reference`` row), over the
committed events of D's datasets:

- ``produced``: events of D's datasets;
- ``consumed``: those consumed by at least one DATASET_TRIGGERED run of D;
- ``doubled``: those consumed by more than one such run;
- ``lost``: those consumed by no run although D has no queue row for their dataset, so
  nothing will ever trigger D for them (an event still waiting for an AND partner or
  for room under max_active_runs keeps its queue row and is not lost);
- ``suspected_lost``: those consumed by no run although a later DATASET_TRIGGERED run of D
  exists (logical date after the event): in stock semantics every event between two
  runs belongs to the later run. This is the audit's view of a live deployment; pauses,
  schedule changes and deleted runs are not recorded by Airflow, so it errs on the side
  of showing;
- ``empty_runs``: DATASET_TRIGGERED runs of D that consumed no event;
- ``out_of_order``: DATASET_TRIGGERED runs of D whose logical date is before that of a
  run of D created earlier (lower id);
- ``lingering``: queue rows of D while D is unpaused, has room under max_active_runs and
  its dataset condition holds on the queued datasets (after a drain there must be none).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields

from sqlalchemy import and_, case, exists, func, select
from sqlalchemy.orm import Session, aliased

from airflow.models.dag import DagModel
from airflow.models.dagrun import DagRun
from airflow.models.dataset import (
    DagScheduleDatasetReference,
    DatasetDagRunQueue,
    DatasetEvent,
    DatasetModel,
    association_table,
)
from airflow.models.serialized_dag import SerializedDagModel
from airflow.utils.state import DagRunState
from airflow.utils.types import DagRunType

VIOLATIONS = ("lost", "doubled", "empty_runs", "out_of_order", "lingering")


@dataclass
class DagReport:
    dag_id: str
    produced: int = 0
    consumed: int = 0
    runs: int = 0
    lost: int = 0
    suspected_lost: int = 0
    doubled: int = 0
    empty_runs: int = 0
    out_of_order: int = 0
    lingering: int = 0

    def violations(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in VIOLATIONS if getattr(self, name)}


@dataclass
class Report:
    dags: list[DagReport] = field(default_factory=list)

    def total(self, name: str) -> int:
        return sum(getattr(d, name) for d in self.dags)

    def totals(self) -> dict[str, int]:
        names = [f.name for f in fields(DagReport) if f.name != "dag_id"]
        return {name: self.total(name) for name in names}

    def violations(self) -> dict[str, int]:
        return {name: self.total(name) for name in VIOLATIONS if self.total(name)}

    def by_dag(self) -> dict[str, DagReport]:
        return {d.dag_id: d for d in self.dags}

    def as_dict(self) -> dict:
        return {"totals": self.totals(), "dags": [asdict(d) for d in self.dags]}


def _dataset_triggered(run=DagRun):
    return run.run_type == DagRunType.DATASET_TRIGGERED


def consuming_dag_ids(session: Session) -> list[str]:
    return list(session.scalars(select(DagScheduleDatasetReference.dag_id).distinct().order_by("dag_id")))


def check(session: Session, dag_ids: Iterable[str] | None = None) -> Report:
    """Measure the invariant for ``dag_ids`` (default: every DAG scheduled on datasets)."""
    dag_ids = sorted(set(dag_ids) if dag_ids is not None else consuming_dag_ids(session))
    reports = {dag_id: DagReport(dag_id) for dag_id in dag_ids}
    if not dag_ids:
        return Report([])

    ref = DagScheduleDatasetReference
    run = aliased(DagRun)
    # Number of D's dataset-triggered runs that consumed each event of D's datasets.
    times_consumed = (
        select(func.count())
        .select_from(association_table.join(run, run.id == association_table.c.dag_run_id))
        .where(association_table.c.event_id == DatasetEvent.id, run.dag_id == ref.dag_id, _dataset_triggered(run))
        .scalar_subquery()
    )
    later_run = exists().where(
        DagRun.dag_id == ref.dag_id, _dataset_triggered(), DagRun.execution_date > DatasetEvent.timestamp
    )
    queued = exists().where(
        DatasetDagRunQueue.target_dag_id == ref.dag_id, DatasetDagRunQueue.dataset_id == DatasetEvent.dataset_id
    )
    per_event = (
        select(
            ref.dag_id.label("dag_id"),
            times_consumed.label("n"),
            case((later_run, 1), else_=0).label("later_run"),
            case((queued, 1), else_=0).label("queued"),
        )
        .join(DatasetEvent, DatasetEvent.dataset_id == ref.dataset_id)
        .where(ref.dag_id.in_(dag_ids))
        .subquery()
    )
    never = per_event.c.n == 0
    rows = session.execute(
        select(
            per_event.c.dag_id,
            func.count(),
            func.sum(case((per_event.c.n > 0, 1), else_=0)),
            func.sum(case((per_event.c.n > 1, 1), else_=0)),
            func.sum(case((and_(never, per_event.c.queued == 0), 1), else_=0)),
            func.sum(case((and_(never, per_event.c.later_run == 1), 1), else_=0)),
        ).group_by(per_event.c.dag_id)
    )
    for dag_id, produced, consumed, doubled, lost, suspected in rows:
        r = reports[dag_id]
        r.produced, r.consumed, r.doubled = int(produced), int(consumed or 0), int(doubled or 0)
        r.lost, r.suspected_lost = int(lost or 0), int(suspected or 0)

    consumed_any = exists().where(association_table.c.dag_run_id == DagRun.id)
    earlier_later_dated = aliased(DagRun)
    out_of_order = exists().where(
        earlier_later_dated.dag_id == DagRun.dag_id,
        _dataset_triggered(earlier_later_dated),
        earlier_later_dated.id < DagRun.id,
        earlier_later_dated.execution_date > DagRun.execution_date,
    )
    for dag_id, runs, empty, disordered in session.execute(
        select(
            DagRun.dag_id,
            func.count(),
            func.sum(case((~consumed_any, 1), else_=0)),
            func.sum(case((out_of_order, 1), else_=0)),
        )
        .where(DagRun.dag_id.in_(dag_ids), _dataset_triggered())
        .group_by(DagRun.dag_id)
    ):
        r = reports[dag_id]
        r.runs, r.empty_runs, r.out_of_order = int(runs), int(empty or 0), int(disordered or 0)

    for dag_id, count in _lingering(session, dag_ids).items():
        reports[dag_id].lingering = count
    return Report(list(reports.values()))


def _lingering(session: Session, dag_ids: list[str]) -> dict[str, int]:
    queued: dict[str, set[str]] = {}
    for dag_id, uri in session.execute(
        select(DatasetDagRunQueue.target_dag_id, DatasetModel.uri)
        .join(DatasetModel, DatasetModel.id == DatasetDagRunQueue.dataset_id)
        .where(DatasetDagRunQueue.target_dag_id.in_(dag_ids))
    ):
        queued.setdefault(dag_id, set()).add(uri)
    if not queued:
        return {}
    active = dict(
        session.execute(
            select(DagRun.dag_id, func.count())
            .where(DagRun.dag_id.in_(queued), DagRun.state.in_((DagRunState.QUEUED, DagRunState.RUNNING)))
            .group_by(DagRun.dag_id)
        ).all()
    )
    result = {}
    for dag_model in session.scalars(select(DagModel).where(DagModel.dag_id.in_(queued))):
        if dag_model.is_paused or not dag_model.is_active:
            continue
        if active.get(dag_model.dag_id, 0) >= dag_model.max_active_runs:
            continue
        serialized = session.scalar(select(SerializedDagModel).where(SerializedDagModel.dag_id == dag_model.dag_id))
        if serialized is None:
            continue
        statuses = {uri: True for uri in queued[dag_model.dag_id]}
        if serialized.dag.timetable.dataset_condition.evaluate(statuses):
            result[dag_model.dag_id] = len(queued[dag_model.dag_id])
    return result


__all__ = ["DagReport", "Report", "VIOLATIONS", "check", "consuming_dag_ids"]
