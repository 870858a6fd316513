#
# Licensed to the Apache Software Foundation (ASF) under one
# or more contributor license agreements.  See the NOTICE file
# distributed with this work for additional information
# regarding copyright ownership.  The ASF licenses this file
# to you under the Apache License, Version 2.0 (the
# "License"); you may not use this file except in compliance
# with the License.  You may obtain a copy of the License at
#
#   http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing,
# software distributed under the License is distributed on an
# "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY
# KIND, either express or implied.  See the License for the
# specific language governing permissions and limitations
# under the License.
#
# Modified by the airflow-dataset-race-fix project: the member below is
# airflow.jobs.scheduler_job_runner.SchedulerJobRunner._create_dag_runs_dataset_triggered
# (Airflow 2.10.4), kept as a small diff of the original.
"""
The scheduler side of the fix: which events a dataset-triggered run consumes.

Stock Airflow gives a ready DAG the window ``(previous run, max(queue created_at)]`` of
event *timestamps*, creates a run even when that window is empty, and then deletes every
queue row of the DAG. Timestamps are taken at flush time on the producer's host, while
rows become visible at commit time, so a window of timestamps misses late commits (S3),
double-counts late queue rows (S6), and the blanket delete drops rows that arrived while
the run was being created (S2).

The fixed member selects events by what the DAG has *consumed*, not by time:

- events of the DAG's datasets (and of the datasets its queue rows name, for alias
  schedules not yet re-parsed) that no run of this DAG consumed yet, and whose timestamp
  is above a floor: the latest dataset-triggered run's logical date (or the oldest queue
  row read, if older) minus ``[dataset_race_fix] event_lookback_seconds`` (default 900).
  The floor only keeps the ``(dataset_id, timestamp)`` index useful; it tolerates that
  much commit latency and clock skew between producer hosts;
- a run only when the DAG's dataset condition holds on the datasets that have such
  events (no empty run, and an AND condition is not met by a queue row whose events an
  earlier run already took);
- the run's logical date is the newest of: the queue rows, the consumed events, and one
  microsecond after the latest dataset-triggered run, so runs stay in order;
- the queue rows are read again, ``FOR UPDATE SKIP LOCKED`` where Airflow uses row
  locks, and deleted exactly as read (key and created_at). Producers move created_at on
  every write, so a row that a producer touched meanwhile survives; a row that a
  producer still holds is skipped, never waited for. When no run is created, the rows
  whose datasets have nothing left to consume are deleted, so they cannot make the
  scheduler spin.

Nothing here commits: all of it is in the scheduler's own transaction, as before.
Every global below must name the same object in ``airflow.jobs.scheduler_job_runner``.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import TYPE_CHECKING, Collection

from sqlalchemy import and_, delete, func, or_, select

from airflow.configuration import conf
from airflow.models.dagrun import DagRun
from airflow.models.dataset import (
    DagScheduleDatasetReference,
    DatasetDagRunQueue,
    DatasetEvent,
    DatasetModel,
)
from airflow.stats import Stats
from airflow.timetables.simple import DatasetTriggeredTimetable
from airflow.utils import timezone
from airflow.utils.sqlalchemy import with_row_locks
from airflow.utils.state import DagRunState
from airflow.utils.types import DagRunType

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.orm import Session

    from airflow.models.dag import DagModel


class SchedulerJobRunner:
    """Mirror of ``airflow.jobs.scheduler_job_runner.SchedulerJobRunner``: only the fixed member."""

    def _create_dag_runs_dataset_triggered(
        self,
        dag_models: Collection[DagModel],
        dataset_triggered_dag_info: dict[str, tuple[datetime, datetime]],
        session: Session,
    ) -> None:
        """For DAGs that are triggered by datasets, create dag runs."""
        dag_ids = [dm.dag_id for dm in dag_models]
        # Read the queue rows of these DAGs again, locking them where Airflow uses row locks
        # (skipping rows a producer still holds): they are deleted below exactly as read.
        queued_rows: dict[str, dict[int, datetime]] = defaultdict(dict)
        for dataset_id, target_dag_id, created_at in session.execute(
            with_row_locks(
                select(
                    DatasetDagRunQueue.dataset_id,
                    DatasetDagRunQueue.target_dag_id,
                    DatasetDagRunQueue.created_at,
                )
                .where(DatasetDagRunQueue.target_dag_id.in_(dag_ids))
                .order_by(DatasetDagRunQueue.dataset_id, DatasetDagRunQueue.target_dag_id),
                of=DatasetDagRunQueue,
                session=session,
                skip_locked=True,
            )
        ):
            queued_rows[target_dag_id][dataset_id] = created_at
        # Each DAG's datasets (with their URIs, for the condition): those it is scheduled on,
        # and those its queue rows name (an alias that resolved to a dataset before the DAG
        # was parsed again).
        dataset_ids_of: dict[str, set[int]] = defaultdict(set)
        dataset_uris: dict[int, str] = {}
        for dag_id, dataset_id, uri in session.execute(
            select(DagScheduleDatasetReference.dag_id, DatasetModel.id, DatasetModel.uri)
            .join(DatasetModel, DatasetModel.id == DagScheduleDatasetReference.dataset_id)
            .where(DagScheduleDatasetReference.dag_id.in_(dag_ids))
        ):
            dataset_ids_of[dag_id].add(dataset_id)
            dataset_uris[dataset_id] = uri
        for dag_id, queued in queued_rows.items():
            dataset_ids_of[dag_id].update(queued)
        if unknown := set().union(*queued_rows.values()) - dataset_uris.keys():
            dataset_uris.update(
                session.execute(select(DatasetModel.id, DatasetModel.uri).where(DatasetModel.id.in_(unknown)))
            )
        lookback = timedelta(
            seconds=max(0, conf.getint("dataset_race_fix", "event_lookback_seconds", fallback=900))
        )

        for dag_model in sorted(dag_models, key=lambda dm: dm.dag_id):  # one lock order with producers
            dag = self.dagbag.get_dag(dag_model.dag_id, session=session)
            if not dag:
                self.log.error("DAG '%s' not found in serialized_dag table", dag_model.dag_id)
                continue

            if not isinstance(dag.timetable, DatasetTriggeredTimetable):
                self.log.error(
                    "DAG '%s' was dataset-scheduled, but didn't have a DatasetTriggeredTimetable!",
                    dag_model.dag_id,
                )
                continue

            dag_hash = self.dagbag.dags_hash.get(dag.dag_id)

            queued = queued_rows.get(dag.dag_id, {})
            # The latest dataset-triggered run, and the latest run of any type (for the unique date).
            latest_run_date, latest_any_run_date = session.execute(
                select(
                    select(DagRun.execution_date)
                    .where(DagRun.dag_id == dag.dag_id, DagRun.run_type == DagRunType.DATASET_TRIGGERED)
                    .order_by(DagRun.execution_date.desc())
                    .limit(1)
                    .scalar_subquery(),
                    select(func.max(DagRun.execution_date)).where(DagRun.dag_id == dag.dag_id).scalar_subquery(),
                )
            ).one()
            dataset_event_filters = [DatasetEvent.dataset_id.in_(sorted(dataset_ids_of[dag.dag_id]))]
            if latest_run_date:  # else no run of this DAG has consumed anything yet
                from airflow.models.dataset import association_table

                floor = min([latest_run_date, *queued.values()]) - lookback
                # What this DAG already consumed. A run is never dated before the events it
                # consumed, so only its runs from the floor on matter: a small set, which the
                # databases hash once instead of probing per event.
                consumed = (
                    select(association_table.c.event_id)
                    .join(DagRun, DagRun.id == association_table.c.dag_run_id)
                    .where(DagRun.dag_id == dag.dag_id, DagRun.execution_date >= floor)
                )
                dataset_event_filters += [DatasetEvent.timestamp >= floor, DatasetEvent.id.not_in(consumed)]

            dataset_events = session.scalars(select(DatasetEvent).where(*dataset_event_filters)).all()

            with_events = {event.dataset_id for event in dataset_events}
            statuses = {dataset_uris[dataset_id]: True for dataset_id in with_events if dataset_id in dataset_uris}
            try:
                ready = bool(dataset_events) and dag.timetable.dataset_condition.evaluate(statuses)
            except AttributeError:  # serialized before 2.9, as in DagModel.dags_needing_dagruns
                self.log.warning("dag '%s' has old serialization; skipping DAG run creation.", dag.dag_id)
                continue
            if not ready:
                # Nothing new to run on. Queue rows whose datasets have no event left to consume
                # are stale; drop them (as read) so they do not make this DAG look ready again.
                stale = {ds_id: ts for ds_id, ts in queued.items() if ds_id not in with_events}
                if stale:
                    self._delete_dataset_queue_rows_as_read(dag.dag_id, stale, session)
                Stats.incr("dataset_race_fix.empty_runs_prevented")
                continue

            exec_date = max(
                [
                    timezone.coerce_datetime(dataset_triggered_dag_info[dag.dag_id][1]),
                    *queued.values(),
                    *(event.timestamp for event in dataset_events),
                ]
            )
            if latest_run_date:
                exec_date = max(exec_date, latest_run_date + timedelta(microseconds=1))
                if late := sum(1 for event in dataset_events if event.timestamp <= latest_run_date):
                    Stats.incr("dataset_race_fix.late_events_consumed", late)
            # Explicitly check if a DagRun already exists at this date (a manual run, say):
            # move past it rather than fail on the unique key or leave the queue rows behind.
            if latest_any_run_date and exec_date <= latest_any_run_date:
                while session.scalar(
                    select(func.count(DagRun.id)).where(
                        DagRun.dag_id == dag.dag_id, DagRun.execution_date == exec_date
                    )
                ):
                    exec_date += timedelta(microseconds=1)
            exec_date = timezone.coerce_datetime(exec_date)

            data_interval = dag.timetable.data_interval_for_events(exec_date, dataset_events)
            run_id = dag.timetable.generate_run_id(
                run_type=DagRunType.DATASET_TRIGGERED,
                logical_date=exec_date,
                data_interval=data_interval,
                session=session,
                events=dataset_events,
            )

            dag_run = dag.create_dagrun(
                run_id=run_id,
                run_type=DagRunType.DATASET_TRIGGERED,
                execution_date=exec_date,
                data_interval=data_interval,
                state=DagRunState.QUEUED,
                external_trigger=False,
                session=session,
                dag_hash=dag_hash,
                creating_job_id=self.job.id,
            )
            Stats.incr("dataset.triggered_dagruns")
            dag_run.consumed_dataset_events.extend(dataset_events)
            if queued:
                self._delete_dataset_queue_rows_as_read(dag_run.dag_id, queued, session)

    @staticmethod
    def _delete_dataset_queue_rows_as_read(
        dag_id: str, rows: dict[int, datetime], session: Session
    ) -> None:
        """Delete queue rows of ``dag_id`` that still have the created_at they were read with."""
        session.execute(
            delete(DatasetDagRunQueue)
            .where(
                DatasetDagRunQueue.target_dag_id == dag_id,
                or_(
                    *(
                        and_(DatasetDagRunQueue.dataset_id == dataset_id, DatasetDagRunQueue.created_at == ts)
                        for dataset_id, ts in sorted(rows.items())
                    )
                ),
            )
            .execution_options(synchronize_session=False)
        )
