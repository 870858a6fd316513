"""
``late-restart``: a late commit on a quiet DAG after a restart, beside 10 busy DAGs' windows of
``--late-events`` events: the loops and seconds until it is consumed.
"""

from __future__ import annotations

import statistics
import time
from datetime import datetime, timedelta, timezone

from reproduce.benchmark.cases.fan_out import FANOUT_RUN_EVENTS, FANOUT_WINDOW_SECONDS
from reproduce.benchmark.runner import Variants, log
from reproduce.benchmark.scheduler import net_caught_up, new_scheduler_runner, scheduler_pass
from reproduce.benchmark.world import consumed_run_row, event_rows, make_consumers, quiet_other_dags

LATE_BUSY_DAGS = 10


def bench_late_after_restart(
    variants: Variants, sizes: tuple[int, ...], notes: list[str], pass_limit: float = 900.0
) -> None:
    """
    Issue 47: per size, 10 busy DAGs on a dataset each with ``size`` events in all over the last 800 s, each
    consumed by a run of its DAG (100 a run), and a quiet DAG whose latest run is older, with a late commit
    below it: an event between its two runs, consumed by neither, with no queue row (committed before the
    restart). A new fixed scheduler runner (a restart) loops back to back until a run consumes the late event,
    then on until its window pass is over (at most ``pass_limit`` seconds); then the run is deleted and
    another restarted runner loops once a second (a scheduler's idle loop). Notes: the loops and seconds each
    took, the slowest loop.
    """
    from airflow import settings
    from airflow.datasets import Dataset
    from airflow.models.dagrun import DagRun
    from airflow.models.dataset import DatasetEvent, DatasetModel
    from airflow.utils.state import DagRunState
    from sqlalchemy import delete, func, insert, select, text

    variants.use("fixed")
    for size in sizes:
        started = time.monotonic()
        uris = {f"busy{b}": f"bench://late/{size}/{b}" for b in range(LATE_BUSY_DAGS)} | {
            "quiet": f"bench://late/{size}/q"
        }
        names = make_consumers(f"bench_late_{size}", {name: [Dataset(uri)] for name, uri in uris.items()})
        quiet_other_dags(names)
        end, per_dag = datetime.now(timezone.utc) - timedelta(seconds=5), size // LATE_BUSY_DAGS
        step = timedelta(seconds=FANOUT_WINDOW_SECONDS) / per_dag

        with settings.Session() as session:
            ids = dict(
                session.execute(
                    select(DatasetModel.uri, DatasetModel.id).where(DatasetModel.uri.in_(uris.values()))
                ).all()
            )
            for b in range(LATE_BUSY_DAGS):
                dag_id, dataset_id = f"bench_late_{size}_busy{b}", ids[uris[f"busy{b}"]]
                instants = [end - step * (per_dag - i) for i in range(per_dag)]
                for first in range(0, per_dag, 5000):
                    session.execute(
                        insert(DatasetEvent),
                        event_rows(dataset_id, instants[first : first + 5000], "bench_late"),
                    )
                batches = [instants[i : i + FANOUT_RUN_EVENTS] for i in range(0, per_dag, FANOUT_RUN_EVENTS)]
                session.execute(
                    insert(DagRun), [consumed_run_row(dag_id, batch[0], batch[-1]) for batch in batches]
                )
                session.execute(
                    text(
                        "INSERT INTO dagrun_dataset_event (dag_run_id, event_id) SELECT r.id, e.id "
                        "FROM dag_run r JOIN dataset_event e ON e.dataset_id = :dataset_id "
                        "AND e.timestamp >= r.data_interval_start AND e.timestamp <= r.data_interval_end "
                        "WHERE r.dag_id = :dag_id"
                    ),
                    {"dataset_id": dataset_id, "dag_id": dag_id},
                )
                session.commit()
            quiet, dataset_id = f"bench_late_{size}_quiet", ids[uris["quiet"]]
            stamps = [end - timedelta(seconds=seconds) for seconds in (700, 500, 300)]  # e1, the late one, e2
            session.execute(insert(DatasetEvent), event_rows(dataset_id, stamps, "bench_late"))
            session.execute(
                insert(DagRun),
                [
                    consumed_run_row(quiet, stamps[0], stamps[0] + timedelta(seconds=50)),
                    consumed_run_row(quiet, stamps[2], stamps[2] + timedelta(seconds=50)),
                ],
            )
            session.execute(
                text(
                    "INSERT INTO dagrun_dataset_event (dag_run_id, event_id) SELECT r.id, e.id "
                    "FROM dag_run r JOIN dataset_event e ON e.dataset_id = :dataset_id "
                    "AND e.timestamp = r.data_interval_start WHERE r.dag_id = :dag_id"
                ),
                {"dataset_id": dataset_id, "dag_id": quiet},
            )
            session.commit()
        seconds = time.monotonic() - started
        log(f"  {size} events in {LATE_BUSY_DAGS} busy DAGs' windows ({seconds:.0f} s to write)")

        def late_consumed() -> bool:
            with settings.Session() as session:
                return bool(
                    session.scalar(
                        select(func.count()).where(DagRun.dag_id == quiet, DagRun.state == DagRunState.QUEUED)
                    )
                )

        for pace in (0.0, 1.0):
            runner, laps, found_after = new_scheduler_runner(), [], None
            began = time.monotonic()
            while True:
                loop_began = time.perf_counter()
                session = settings.Session.session_factory()
                error = scheduler_pass(runner, session)
                session.close()
                laps.append(time.perf_counter() - loop_began)
                if error:
                    notes.append(f"late after a restart, {size}: a loop failed: {error}")
                if found_after is None and late_consumed():
                    found_after = (len(laps), time.monotonic() - began)
                pass_over = net_caught_up(runner)
                if (found_after and (pace or pass_over)) or time.monotonic() - began > pass_limit:
                    break
                time.sleep(max(0.0, pace - laps[-1]))
            what = "back to back" if not pace else "a second apart"
            notes.append(
                f"late after a restart, {size} events in {LATE_BUSY_DAGS} busy DAGs' windows, loops {what}: "
                + (
                    f"the quiet DAG's late event consumed in loop {found_after[0]}, {found_after[1]:.2f} s "
                    "after the start"
                    if found_after
                    else f"not consumed after {time.monotonic() - began:.0f} s"
                )
                + (
                    f"; the net caught up after {len(laps)} loops, {time.monotonic() - began:.1f} s"
                    if not pace and pass_over
                    else ""
                )
                + f"; first loop {laps[0] * 1000:.1f} ms, then "
                f"median {statistics.median(laps[1:] or laps) * 1000:.1f} ms, "
                f"max {max(laps[1:] or laps) * 1000:.1f} ms"
            )
            with settings.Session() as session:  # give the event back for the next restart
                session.execute(
                    delete(DagRun).where(DagRun.dag_id == quiet, DagRun.state == DagRunState.QUEUED)
                )
                session.commit()
    variants.use("stock")
