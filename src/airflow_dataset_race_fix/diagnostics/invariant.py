"""
The invariant checker: what the metadata tables say about dataset-triggered runs (counters:
docs/audit-json.md). It reads Airflow's tables only, never the fix, so it judges stock and
fixed code alike. ``check()`` counts and ``audit()`` also lists, from one scan (``_Scan``):
per batch of DAGs, a few set-based queries that return only the rows carrying a finding.

An event waiting for an AND partner or for room under max_active_runs keeps its queue row
and is not ``lost``. ``suspected_lost`` assumes stock semantics (every event between two
runs belongs to the later run) and errs on the side of showing: Airflow records no pauses,
schedule changes or deleted runs. ``since`` limits the events (timestamp) and runs (logical
date); queue rows are current state and always examined.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from types import SimpleNamespace

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
from sqlalchemy import and_, any_, case, exists, func, select, text, true
from sqlalchemy.dialects.postgresql import array_agg
from sqlalchemy.orm import Session
from sqlalchemy.sql import ColumnElement, Subquery

# What the tests require to be zero with the fix, after a drain.
VIOLATIONS = ("lost", "doubled", "empty_runs", "out_of_order", "lingering")
# What the audit reports as damage in a live deployment's history.
FINDINGS = (
    "suspected_lost",
    "not_queued_unpaused",
    "doubled",
    "empty_runs",
    "out_of_order",
    "future_dated",
    "overlapping_intervals",
)

# DAGs per query: large enough for few round trips, small enough for a live progress display.
DAG_BATCH = 20

# The event scan per dialect: PostgreSQL and SQLite hash-join a batch of DAGs at once;
# MariaDB/MySQL look each event up (no hash join by default), which is fastest one DAG at a time.
EVENT_BATCH = {"mysql": 1}

# progress(dags_done, dags_total) after each batch of DAGs.
Progress = Callable[[int, int], None]


@dataclass
class DagReport:
    dag_id: str
    produced: int = 0
    consumed: int = 0
    runs: int = 0
    lost: int = 0
    not_queued_unpaused: int = 0  # of lost: not suspected lost, of an unpaused DAG (a paused one queues none)
    suspected_lost: int = 0
    doubled: int = 0
    empty_runs: int = 0
    out_of_order: int = 0
    lingering: int = 0
    stale_queue_rows: int = 0
    future_dated: int = 0
    overlapping_intervals: int = 0

    def violations(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in VIOLATIONS if getattr(self, name)}

    def findings(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in FINDINGS if getattr(self, name)}


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

    def findings(self) -> dict[str, int]:
        return {name: self.total(name) for name in FINDINGS if self.total(name)}

    def by_dag(self) -> dict[str, DagReport]:
        return {d.dag_id: d for d in self.dags}

    def as_dict(self) -> dict:
        return {"totals": self.totals(), "dags": [asdict(d) for d in self.dags]}


# -- what audit() lists -----------------------------------------------------------------
@dataclass
class StrandedGroup:
    """
    Events of one dataset that no run of one DAG consumed and that will not reach it by
    themselves: suspected lost (a later run exists) or not queued (no queue row names
    their dataset for the DAG). What ``audit --requeue`` works on.
    """

    dag_id: str
    dataset_id: int
    dataset_uri: str
    events: int
    suspected_lost: int
    not_queued: int
    oldest: datetime
    newest: datetime
    queued_at: datetime | None  # the DAG's queue row for this dataset, if any


@dataclass
class EventFinding:
    dag_id: str
    event_id: int
    dataset_uri: str
    timestamp: datetime
    run_ids: list[str] = field(default_factory=list)  # the DAG's runs that consumed it


@dataclass
class RunFinding:
    dag_id: str
    run_id: str
    logical_date: datetime
    earlier_run_date: datetime | None = None  # out of order: newest date among earlier-created runs
    # The scheduler job that created the run, and its host: the fixed scheduler creates no
    # empty and no out-of-order run, so the one that did ran without the fix then.
    creating_job_id: int | None = None
    creating_host: str | None = None


@dataclass
class IntervalFinding:
    """A run whose data interval starts before the run just before it (by logical date) ended."""

    dag_id: str
    run_id: str
    logical_date: datetime
    data_interval_start: datetime
    previous_interval_end: datetime


@dataclass
class QueueFinding:
    dag_id: str
    dataset_uri: str
    created_at: datetime
    latest_run_date: datetime


@dataclass
class Audit:
    report: Report
    stranded: list[StrandedGroup] = field(default_factory=list)
    suspected_lost: list[EventFinding] = field(default_factory=list)
    doubled: list[EventFinding] = field(default_factory=list)
    empty_runs: list[RunFinding] = field(default_factory=list)
    out_of_order: list[RunFinding] = field(default_factory=list)
    stale_queue_rows: list[QueueFinding] = field(default_factory=list)
    future_dated: list[EventFinding] = field(default_factory=list)
    overlapping_intervals: list[IntervalFinding] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            **self.report.as_dict(),
            "findings": {name: [asdict(item) for item in getattr(self, name)] for name in _LISTS},
        }


_LISTS = (
    "stranded",
    "suspected_lost",
    "doubled",
    "empty_runs",
    "out_of_order",
    "stale_queue_rows",
    "future_dated",
    "overlapping_intervals",
)


# -- facts: one row per (DAG, event), per run, per queue row ----------------------------
def _dataset_triggered(run=DagRun) -> ColumnElement:
    return run.run_type == DagRunType.DATASET_TRIGGERED


def _latest_runs(dag_ids: Sequence[str]):
    """Each DAG's latest DATASET_TRIGGERED logical date (index on dag_id, execution_date)."""
    return (
        select(DagRun.dag_id.label("dag_id"), func.max(DagRun.execution_date).label("latest_run"))
        .where(DagRun.dag_id.in_(dag_ids), _dataset_triggered())
        .group_by(DagRun.dag_id)
    )


def _dated_from(query, since: datetime | None):
    """``query`` limited to the runs dated from ``since`` on (all when None)."""
    return query if since is None else query.where(DagRun.execution_date >= since)


def _consumption(dag_ids: Sequence[str]) -> Subquery:
    """
    How many DATASET_TRIGGERED runs of each DAG consumed each event (``dag_run_id`` index).
    For a single DAG the key is the event id alone: MariaDB then probes an integer key
    (4x faster than with the DAG id in it).
    """
    key = (
        [association_table.c.event_id] if len(dag_ids) == 1 else [DagRun.dag_id, association_table.c.event_id]
    )
    return (
        select(*(column.label(column.name) for column in key), func.count().label("n"))
        .select_from(DagRun)
        .join(association_table, association_table.c.dag_run_id == DagRun.id)
        .where(DagRun.dag_id.in_(dag_ids), _dataset_triggered())
        .group_by(*key)
        .subquery("consumption")
    )


def _events_of(dag_ids: Sequence[str], since: datetime | None):
    """(DAG, event) for the events of each DAG's datasets, through ``(dataset_id, timestamp)``."""
    ref = DagScheduleDatasetReference
    query = select(ref.dag_id).join(DatasetEvent, DatasetEvent.dataset_id == ref.dataset_id)
    query = query.where(ref.dag_id.in_(dag_ids))
    return query if since is None else query.where(DatasetEvent.timestamp >= since)


def _event_facts(dag_ids: Sequence[str], since: datetime | None) -> Subquery:
    """
    Per (DAG, event of its datasets): how many of its runs consumed it, its latest run and
    queue row. Joined in one pass, not a correlated subquery (re-evaluated per predicate).
    """
    ref = DagScheduleDatasetReference
    consumption = _consumption(dag_ids)
    latest = _latest_runs(dag_ids).subquery("latest_runs")
    query = (
        _events_of(dag_ids, since)
        .add_columns(
            DatasetEvent.id.label("event_id"),
            DatasetEvent.dataset_id.label("dataset_id"),
            DatasetEvent.timestamp.label("timestamp"),
            func.coalesce(consumption.c.n, 0).label("n"),
            latest.c.latest_run,
            DatasetDagRunQueue.created_at.label("queued_at"),
        )
        .outerjoin(
            consumption,
            and_(
                consumption.c.event_id == DatasetEvent.id,
                *([consumption.c.dag_id == ref.dag_id] if "dag_id" in consumption.c else []),
            ),
        )
        .outerjoin(latest, latest.c.dag_id == ref.dag_id)
        .outerjoin(
            DatasetDagRunQueue,
            and_(
                DatasetDagRunQueue.target_dag_id == ref.dag_id,
                DatasetDagRunQueue.dataset_id == ref.dataset_id,
            ),
        )
    )
    return query.subquery("event_facts")


def _flag(predicate: ColumnElement, name: str):
    return case((predicate, 1), else_=0).label(name)


def _event_findings(dag_ids: Sequence[str], since: datetime | None):
    """
    The (DAG, event) facts that are not "consumed exactly once", with one flag per counter:
    the only rows that carry a finding, so one scan serves both the counts and the lists.
    """
    f = _event_facts(dag_ids, since)
    unconsumed = f.c.n == 0
    return select(
        f,
        _flag(f.c.n > 1, "doubled"),
        _flag(and_(unconsumed, f.c.queued_at.is_(None)), "lost"),
        _flag(
            and_(unconsumed, f.c.latest_run.is_not(None), f.c.timestamp < f.c.latest_run), "suspected_lost"
        ),
    ).where(f.c.n != 1)


def _empty_runs(dag_ids: Sequence[str], since: datetime | None):
    """DATASET_TRIGGERED runs that consumed no event (``dag_run_id`` index)."""
    consumed_any = exists().where(association_table.c.dag_run_id == DagRun.id)
    query = select(DagRun.dag_id, DagRun.run_id, DagRun.execution_date)
    return _dated_from(query.where(DagRun.dag_id.in_(dag_ids), _dataset_triggered(), ~consumed_any), since)


def _runs_in_creation_order(dag_ids: Sequence[str]):
    """
    The runs by DAG and id, for a running max of logical dates while streaming: out of order
    when the max before a run is later. Not ``max() OVER (ORDER BY id)``: quadratic on MariaDB.
    """
    return (
        select(DagRun.dag_id, DagRun.run_id, DagRun.execution_date)
        .where(DagRun.dag_id.in_(dag_ids), _dataset_triggered())
        .order_by(DagRun.dag_id, DagRun.id)
    )


def _queue_facts(dag_ids: Sequence[str]):
    latest = _latest_runs(dag_ids).subquery("latest_runs")
    return (
        select(
            DatasetDagRunQueue.target_dag_id.label("dag_id"),
            DatasetDagRunQueue.dataset_id,
            DatasetDagRunQueue.created_at,
            latest.c.latest_run,
            _flag(DatasetDagRunQueue.created_at < latest.c.latest_run, "stale"),
        )
        .join(latest, latest.c.dag_id == DatasetDagRunQueue.target_dag_id)
        .where(DatasetDagRunQueue.target_dag_id.in_(dag_ids))
    )


# -- scanning ---------------------------------------------------------------------------
def consuming_dag_ids(session: Session) -> list[str]:
    return list(session.scalars(select(DagScheduleDatasetReference.dag_id).distinct().order_by("dag_id")))


def _batches(items: Sequence, size: int = DAG_BATCH) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


class _Keep:
    """The first ``limit`` items by key (all when None), without holding every candidate."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.items: list[tuple] = []

    def add(self, key: tuple, item) -> None:
        if self.limit == 0:
            return
        self.items.append((key, item))
        if self.limit is not None and len(self.items) >= 2 * self.limit + 1000:
            self._trim()

    def _trim(self) -> None:
        self.items.sort(key=lambda pair: pair[0])
        if self.limit is not None:
            del self.items[self.limit :]

    def result(self) -> list:
        self._trim()
        return [item for _, item in self.items]


class _Scan:
    """One pass over the DAGs, batch by batch: the counters, and the lists (up to ``limit``)."""

    def __init__(self, session: Session, since: datetime | None, limit: int | None) -> None:
        self.session = session
        self.since = since
        self.reports: dict[str, DagReport] = {}
        self.groups: dict[tuple[str, int], StrandedGroup] = {}
        self.lists = {name: _Keep(limit) for name in _LISTS if name != "stranded"}
        self._uris: dict[int, str] = {}

    def run(self, dag_ids: list[str], progress: Progress | None) -> Audit:
        self.reports = {dag_id: DagReport(dag_id) for dag_id in dag_ids}
        # Datasets are few; loaded up front because no query may run while a result streams
        # (MySQL's unbuffered cursors).
        self._uris = dict(self.session.execute(select(DatasetModel.id, DatasetModel.uri)).all())
        done = 0
        for batch in _batches(dag_ids):
            self.unpaused = set(
                self.session.scalars(
                    select(DagModel.dag_id).where(
                        DagModel.dag_id.in_(batch), ~DagModel.is_paused, DagModel.is_active
                    )
                )
            )
            self._events(batch)
            self._runs(batch)
            self._queue(batch)
            done += len(batch)
            if progress is not None:
                progress(done, len(dag_ids))
        result = Audit(Report(list(self.reports.values())))
        result.stranded = sorted(self.groups.values(), key=lambda g: (g.dag_id, g.dataset_uri))
        for name, keep in self.lists.items():
            setattr(result, name, keep.result())
        _attach_consuming_runs(self.session, result.doubled + result.future_dated)
        _attach_creating_schedulers(self.session, result.empty_runs + result.out_of_order)
        return result

    def uri(self, dataset_id: int) -> str:
        return self._uris.get(dataset_id, f"dataset #{dataset_id}")

    def _events(self, dag_ids: list[str]) -> None:
        session = self.session
        if session.bind.dialect.name != "postgresql":
            return self._count_events(dag_ids)
        # Plain index probes, as the statements are shaped for, whatever the statistics (none: 50 000 links
        # estimated at 13, nested-looped per event; a bitmap for an event's links cost 30 %); no JIT: its
        # compiling costs more.
        names = ("enable_seqscan", "enable_bitmapscan", "jit")
        kept = session.execute(
            text("SELECT " + ", ".join(f"current_setting('{n}') AS {n}" for n in names))
        ).one()
        session.execute(text("SELECT " + ", ".join(f"set_config('{n}', 'off', true)" for n in names)))
        try:
            self._count_events(dag_ids)
        finally:  # as the transaction had them
            restore = ", ".join(f"set_config('{n}', :{n}, true)" for n in names)
            session.execute(text("SELECT " + restore), kept._asdict())

    def _count_events(self, dag_ids: list[str]) -> None:
        # Every event counts as consumed once unless the findings below say otherwise. Counted per dataset (an
        # index range each), not per (DAG, event): a busy dataset's events once, whatever its consumers.
        session, ref, event = self.session, DagScheduleDatasetReference, DatasetEvent
        references = session.execute(select(ref.dag_id, ref.dataset_id).where(ref.dag_id.in_(dag_ids))).all()
        counts = select(event.dataset_id, func.count(), func.min(event.timestamp), func.max(event.timestamp))
        counts = counts.where(event.dataset_id.in_({d for _, d in references})).group_by(event.dataset_id)
        counts = counts.where(event.timestamp >= self.since) if self.since else counts
        per_dataset = {row[0]: (int(row[1]), *row[2:]) for row in session.execute(counts)}
        for dag_id, dataset_id in references:
            report = self.reports[dag_id]
            report.produced = report.consumed = report.produced + per_dataset.get(dataset_id, (0,))[0]
        ahead = _events_of(dag_ids, self.since).where(DatasetEvent.timestamp > datetime.now(timezone.utc))
        for dag_id, event_id, dataset_id, timestamp in self.session.execute(
            ahead.add_columns(DatasetEvent.id, DatasetEvent.dataset_id, DatasetEvent.timestamp)
        ):
            self.reports[dag_id].future_dated += 1
            finding = EventFinding(dag_id, event_id, self.uri(dataset_id), _utc(timestamp))
            self.lists["future_dated"].add((dag_id, finding.timestamp, event_id), finding)
        ran = set(
            session.scalars(
                select(DagRun.dag_id).where(DagRun.dag_id.in_(dag_ids), _dataset_triggered()).distinct()
            )
        )
        self._count_never_ran([(dag_id, d) for dag_id, d in references if dag_id not in ran], per_dataset)
        with_events = [dag_id for dag_id in dag_ids if dag_id in ran and self.reports[dag_id].produced]
        for batch in _batches(with_events, EVENT_BATCH.get(self.session.bind.dialect.name, DAG_BATCH)):
            self._event_findings(batch)

    def _event_findings(self, dag_ids: list[str]) -> None:
        if self.session.bind.dialect.name == "postgresql":
            rows = self._probed_facts(dag_ids)
        else:
            rows = self.session.execute(
                _event_findings(dag_ids, self.since).execution_options(stream_results=True)
            )
        for e in rows:
            report = self.reports[e.dag_id]
            report.consumed -= e.n == 0
            report.doubled += e.doubled
            report.lost += e.lost
            report.suspected_lost += e.suspected_lost
            report.not_queued_unpaused += bool(e.lost and not e.suspected_lost and e.dag_id in self.unpaused)
            timestamp = _utc(e.timestamp)
            if e.lost or e.suspected_lost:
                self._strand(e, timestamp)
            for name in ("suspected_lost", "doubled"):
                if getattr(e, name):
                    finding = EventFinding(e.dag_id, e.event_id, self.uri(e.dataset_id), timestamp)
                    self.lists[name].add((e.dag_id, timestamp, e.event_id), finding)

    def _count_never_ran(self, references: list[tuple[str, int]], per_dataset: dict[int, tuple]) -> None:
        """The events of the DAGs with no run (``references``: theirs), none consumed, counted per dataset."""
        queue, never = DatasetDagRunQueue, sorted({dag_id for dag_id, _ in references})
        queued = select(queue.target_dag_id, queue.dataset_id).where(queue.target_dag_id.in_(never))
        queued = set(self.session.execute(queued))
        for dag_id, dataset_id in references:
            count, oldest, newest = per_dataset.get(dataset_id, (0, None, None))
            self.reports[dag_id].consumed -= count
            if count and (dag_id, dataset_id) not in queued:  # lost: as _strand groups them
                self.reports[dag_id].lost += count
                self.reports[dag_id].not_queued_unpaused += count if dag_id in self.unpaused else 0
                self.groups[dag_id, dataset_id] = StrandedGroup(
                    dag_id,
                    dataset_id,
                    self.uri(dataset_id),
                    count,
                    0,
                    count,
                    _utc(oldest),
                    _utc(newest),
                    None,
                )

    def _probed_facts(self, dag_ids: list[str]) -> list[SimpleNamespace]:
        """
        ``_event_findings``' rows read by ``_window_event_facts`` (PostgreSQL: no plan statistics decide).
        """
        session, queue = self.session, DatasetDagRunQueue
        latest = {dag_id: _utc(date) for dag_id, date in session.execute(_latest_runs(dag_ids))}
        queued = {
            (dag_id, dataset_id): created_at
            for dag_id, dataset_id, created_at in session.execute(
                select(queue.target_dag_id, queue.dataset_id, queue.created_at).where(
                    queue.target_dag_id.in_(dag_ids)
                )
            )
        }
        facts = []
        # each DAG that references the event's dataset, and how many of its runs consumed the event (no
        # cursor: the plan is not one for a first row)
        for event_id, dataset_id, timestamp, referencing, consumers in session.execute(
            _window_event_facts(dag_ids, self.since)
        ).all():
            for dag_id, n in ((dag_id, (consumers or []).count(dag_id)) for dag_id in referencing):
                if n == 1:
                    continue
                timestamp, queued_at, latest_run = (
                    _utc(timestamp),
                    queued.get((dag_id, dataset_id)),
                    latest.get(dag_id),
                )
                facts.append(
                    SimpleNamespace(  # as _event_findings' rows
                        dag_id=dag_id,
                        event_id=event_id,
                        dataset_id=dataset_id,
                        timestamp=timestamp,
                        n=n,
                        queued_at=queued_at,
                        doubled=int(n > 1),
                        lost=int(n == 0 and queued_at is None),
                        suspected_lost=int(n == 0 and latest_run is not None and timestamp < latest_run),
                    )
                )
        return facts

    def _strand(self, e, timestamp: datetime) -> None:
        group = self.groups.get((e.dag_id, e.dataset_id))
        if group is None:
            group = self.groups[e.dag_id, e.dataset_id] = StrandedGroup(
                e.dag_id,
                e.dataset_id,
                self.uri(e.dataset_id),
                0,
                0,
                0,
                timestamp,
                timestamp,
                _utc(e.queued_at),
            )
        group.events += 1
        group.suspected_lost += e.suspected_lost
        group.not_queued += e.lost
        group.oldest, group.newest = min(group.oldest, timestamp), max(group.newest, timestamp)

    def _runs(self, dag_ids: list[str]) -> None:
        counts = select(DagRun.dag_id, func.count()).where(DagRun.dag_id.in_(dag_ids), _dataset_triggered())
        for dag_id, count in self.session.execute(_dated_from(counts, self.since).group_by(DagRun.dag_id)):
            self.reports[dag_id].runs = int(count)
        for dag_id, run_id, date in self.session.execute(_empty_runs(dag_ids, self.since)):
            date = _utc(date)
            self.reports[dag_id].empty_runs += 1
            self.lists["empty_runs"].add((dag_id, date, run_id), RunFinding(dag_id, run_id, date))
        latest: dict[str, datetime] = {}  # running max of logical dates, per DAG
        # With ``since``, only runs dated from it on: one dated before can make none of them
        # out of order (its date is below theirs), and none of them is reported.
        in_order = _dated_from(_runs_in_creation_order(dag_ids), self.since)
        runs = self.session.execute(in_order.execution_options(stream_results=True))
        for dag_id, run_id, date in runs:
            date, earlier = _utc(date), latest.get(dag_id)
            if earlier is not None and earlier > date and (self.since is None or date >= self.since):
                self.reports[dag_id].out_of_order += 1
                self.lists["out_of_order"].add(
                    (dag_id, date, run_id), RunFinding(dag_id, run_id, date, earlier)
                )
            latest[dag_id] = date if earlier is None else max(earlier, date)
        # Overlapping: a run's interval starts before its predecessor's (by logical date) ended. The
        # predecessor only, as the fixed scheduler reads it (the latest run, by index): over a damaged
        # stock history, a running max over all earlier runs would count its every run again.
        previous_end: dict[str, datetime | None] = {}
        intervals = (
            select(
                DagRun.dag_id,
                DagRun.run_id,
                DagRun.execution_date,
                DagRun.data_interval_start,
                DagRun.data_interval_end,
            )
            .where(DagRun.dag_id.in_(dag_ids), _dataset_triggered())
            .order_by(DagRun.dag_id, DagRun.execution_date)
        )
        if self.since is not None:  # the run just before ``since``, as the predecessor of the first
            last = _latest_runs(dag_ids).where(DagRun.execution_date < self.since).subquery()
            on_last = and_(DagRun.dag_id == last.c.dag_id, DagRun.execution_date == last.c.latest_run)
            ends = select(DagRun.dag_id, DagRun.data_interval_end).join(last, on_last)
            previous_end.update((dag_id, _utc(end)) for dag_id, end in self.session.execute(ends))
            intervals = intervals.where(DagRun.execution_date >= self.since)
        for dag_id, run_id, date, start, end in self.session.execute(
            intervals.execution_options(stream_results=True)
        ):
            before, start = previous_end.get(dag_id), _utc(start)
            if before is not None and start is not None and start < before:
                self.reports[dag_id].overlapping_intervals += 1
                finding = IntervalFinding(dag_id, run_id, _utc(date), start, before)
                self.lists["overlapping_intervals"].add((dag_id, finding.logical_date, run_id), finding)
            previous_end[dag_id] = _utc(end)

    def _queue(self, dag_ids: list[str]) -> None:
        for q in self.session.execute(_queue_facts(dag_ids)):
            if q.stale:
                self.reports[q.dag_id].stale_queue_rows += 1
                finding = QueueFinding(
                    q.dag_id, self.uri(q.dataset_id), _utc(q.created_at), _utc(q.latest_run)
                )
                self.lists["stale_queue_rows"].add((q.dag_id, finding.dataset_uri), finding)
        for dag_id, count in _lingering(self.session, dag_ids).items():
            self.reports[dag_id].lingering = count


# -- the web page's bounded count (``check_window``) --------------------------------------
def _window_event_facts(dag_ids: Sequence[str], since: datetime | None):
    """
    The events since ``since`` of the DAGs' datasets that a DAG referencing their dataset did not consume
    exactly once (PostgreSQL), each with those DAGs and the DAGs of the runs that consumed it; no join whose
    cost rests on statistics (one of two derived sets merged the whole consumption history with each event
    after a bulk load). Per event, its links by ``event_id`` and each link's run by primary key, fenced
    LATERAL probes (the run's DAG and type tested outside the fence, or an unanalyzed table scans the DAG's
    runs per link), aggregated per event: no sort of every (DAG, event) pair, which took about half of 0.4 s
    for 100 000 links.
    """
    ref, link = DagScheduleDatasetReference, association_table.c
    referencing = select(ref.dataset_id, array_agg(ref.dag_id).label("dag_ids")).where(
        ref.dag_id.in_(dag_ids)
    )
    referencing = referencing.group_by(ref.dataset_id).subquery("referencing")
    events = select(DatasetEvent.id, DatasetEvent.dataset_id, DatasetEvent.timestamp, referencing.c.dag_ids)
    events = events.join(referencing, referencing.c.dataset_id == DatasetEvent.dataset_id)
    events = events.where(DatasetEvent.timestamp >= since if since else true()).subquery("e")
    links = (
        select(link.dag_run_id)
        .where(link.event_id == events.c.id)
        .offset(0)
        .correlate(events)
        .lateral("links")
    )
    runs = (
        select(DagRun.dag_id, DagRun.run_type).where(DagRun.id == links.c.dag_run_id).offset(0).lateral("run")
    )
    consumed = select(array_agg(runs.c.dag_id).label("dag_ids")).select_from(links).join(runs, true())
    consumed = consumed.where(runs.c.dag_id == any_(events.c.dag_ids), _dataset_triggered(runs.c)).lateral(
        "consumed"
    )
    # each referencing DAG exactly once: all of them among the consumers, and as many consumers
    once = and_(
        consumed.c.dag_ids.contains(events.c.dag_ids),
        func.cardinality(consumed.c.dag_ids) == func.cardinality(events.c.dag_ids),
    )
    return (
        select(events, consumed.c.dag_ids).join(consumed, true()).where(func.coalesce(once, False).is_(False))
    )


class _WindowScan(_Scan):
    """``_Scan`` over the window since ``since`` (required), without the queue's counters."""

    def _queue(self, dag_ids: list[str]) -> None:
        """Not read: lingering and stale queue rows are no finding (``FINDINGS``)."""


def check_window(session: Session, dag_ids: Iterable[str], *, since: datetime) -> Report:
    """
    ``check(..., since=since)``'s counts, queue counters left at 0 (no finding), read by
    ``_window_event_facts`` for the web page: cost follows the events since ``since``.
    """
    return _WindowScan(session, since, 0).run(sorted(set(dag_ids)), None).report


def check(
    session: Session,
    dag_ids: Iterable[str] | None = None,
    *,
    since: datetime | None = None,
    progress: Progress | None = None,
) -> Report:
    """Measure the invariant for ``dag_ids`` (default: every DAG scheduled on datasets)."""
    return audit(session, dag_ids, since=since, limit=0, progress=progress).report


def audit(
    session: Session,
    dag_ids: Iterable[str] | None = None,
    *,
    since: datetime | None = None,
    limit: int | None = None,
    progress: Progress | None = None,
) -> Audit:
    """
    ``check()`` plus the offending events, runs and queue rows: at most ``limit`` of each kind
    (oldest first; None: all). The counts and the stranded groups are always complete.
    """
    dag_ids = sorted(set(dag_ids) if dag_ids is not None else consuming_dag_ids(session))
    return _Scan(session, since, limit).run(dag_ids, progress)


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
        serialized = session.scalar(
            select(SerializedDagModel).where(SerializedDagModel.dag_id == dag_model.dag_id)
        )
        if serialized is None:
            continue
        statuses = {uri: True for uri in queued[dag_model.dag_id]}
        if serialized.dag.timetable.dataset_condition.evaluate(statuses):
            result[dag_model.dag_id] = len(queued[dag_model.dag_id])
    return result


def _attach_creating_schedulers(session: Session, runs: list[RunFinding]) -> None:
    """Each run's ``creating_job_id`` and that job's host (Airflow keeps scheduler jobs in ``job``)."""
    from airflow.jobs.job import Job

    by_key = {(r.dag_id, r.run_id): r for r in runs}
    for batch in _batches(sorted(by_key), 500):
        for dag_id, run_id, job_id, host in session.execute(
            select(DagRun.dag_id, DagRun.run_id, DagRun.creating_job_id, Job.hostname)
            .outerjoin(Job, Job.id == DagRun.creating_job_id)
            .where(DagRun.dag_id.in_({d for d, _ in batch}), DagRun.run_id.in_({r for _, r in batch}))
        ):
            if (dag_id, run_id) in by_key:
                by_key[dag_id, run_id].creating_job_id, by_key[dag_id, run_id].creating_host = job_id, host


def schedulers_without_the_fix(runs: list[RunFinding]) -> list[tuple[str, int, int]]:
    """(host, scheduler job id, runs) per job that created an empty or out-of-order run, most runs first."""
    jobs = [
        (r.creating_host or "unknown host", r.creating_job_id) for r in runs if r.creating_job_id is not None
    ]
    counts = Counter(jobs)
    return sorted(((host, job, n) for (host, job), n in counts.items()), key=lambda t: (-t[2], t[0], t[1]))


def _attach_consuming_runs(session: Session, events: list[EventFinding]) -> None:
    by_key = {(e.dag_id, e.event_id): e for e in events}
    for batch in _batches(sorted({e.event_id for e in events}), 500):
        for event_id, dag_id, run_id in session.execute(
            select(association_table.c.event_id, DagRun.dag_id, DagRun.run_id)
            .join(DagRun, DagRun.id == association_table.c.dag_run_id)
            .where(association_table.c.event_id.in_(batch), _dataset_triggered())
            .order_by(DagRun.execution_date)
        ):
            if (dag_id, event_id) in by_key:
                by_key[dag_id, event_id].run_ids.append(run_id)


def _utc(value: datetime | str | None) -> datetime | None:
    """Aggregates (min/max over CASE) lose the column type on some dialects: coerce to aware UTC."""
    if value is None:
        return None
    if isinstance(value, str):  # SQLite returns the stored text for computed columns
        value = datetime.fromisoformat(value)
    # Airflow stores UTC; a naive value is UTC, not the configured default timezone.
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


__all__ = [
    "Audit",
    "DagReport",
    "EventFinding",
    "FINDINGS",
    "IntervalFinding",
    "StrandedGroup",
    "QueueFinding",
    "Report",
    "RunFinding",
    "VIOLATIONS",
    "audit",
    "check",
    "consuming_dag_ids",
]
