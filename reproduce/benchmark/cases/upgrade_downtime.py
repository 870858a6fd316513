"""
``upgrade-downtime``: the documented upgrade procedure (docs/behaviour.md) at scale: every scheduler
stopped for ``--minutes`` while producers commit, a few of them late (stamped before the last stock
loop's runs, committed during the stop); then one fixed scheduler starts. The seconds and loops until
every late event is consumed, the loop times (median, p99, max) until then and until the backlog is
drained, and the invariant after the drain.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from reproduce.benchmark.figures import p99
from reproduce.benchmark.producers import producer_transaction
from reproduce.benchmark.runner import Variants, log
from reproduce.benchmark.scheduler import finish_runs, new_scheduler_runner, scheduler_pass
from reproduce.benchmark.world import consumed_run_row, event_rows, make_consumers, quiet_other_dags

UPGRADE_RUN_EVENTS = 100  # history events a historical run consumed
UPGRADE_PRODUCERS = 4  # producer threads during the stop, ``rate`` transactions a second in all


def _dataset_triggered_runs(session, dag_ids: list[str], state: str | None = None) -> int:
    from airflow.models.dagrun import DagRun
    from airflow.utils.types import DagRunType
    from sqlalchemy import func, select

    query = select(func.count()).where(
        DagRun.dag_id.in_(dag_ids), DagRun.run_type == DagRunType.DATASET_TRIGGERED
    )
    return session.scalar(query if state is None else query.where(DagRun.state == state))


def _write_history(names: dict[int, list[str]], uris: list[str], events: int) -> None:
    """``events`` events on each x over the 800 s before the start, consumed by its consumers (100 a run)."""
    from airflow import settings
    from airflow.models.dagrun import DagRun
    from airflow.models.dataset import DatasetEvent, DatasetModel
    from sqlalchemy import bindparam, insert, select, text

    end = datetime.now(timezone.utc) - timedelta(seconds=60)
    step = timedelta(seconds=800) / events
    instants = [end - step * (events - i) for i in range(events)]
    batches = [instants[i : i + UPGRADE_RUN_EVENTS] for i in range(0, events, UPGRADE_RUN_EVENTS)]
    with settings.Session() as session:
        ids = dict(
            session.execute(select(DatasetModel.uri, DatasetModel.id).where(DatasetModel.uri.in_(uris))).all()
        )
        for pair, dag_ids in names.items():
            dataset_id = ids[uris[pair]]
            for start in range(0, events, 5000):
                session.execute(
                    insert(DatasetEvent),
                    event_rows(dataset_id, instants[start : start + 5000], "bench_upgrade"),
                )
            for dag_id in dag_ids:
                session.execute(insert(DagRun), [consumed_run_row(dag_id, b[0], b[-1]) for b in batches])
            session.execute(
                text(
                    "INSERT INTO dagrun_dataset_event (dag_run_id, event_id) SELECT r.id, e.id "
                    "FROM dag_run r JOIN dataset_event e ON e.dataset_id = :dataset_id "
                    "AND e.timestamp >= r.data_interval_start AND e.timestamp <= r.data_interval_end "
                    "WHERE r.dag_id IN :dag_ids"
                ).bindparams(bindparam("dag_ids", expanding=True)),
                {"dataset_id": dataset_id, "dag_ids": dag_ids},
            )
            session.commit()


def _one_transaction(datasets: list[Any]) -> None:
    """One producer transaction with an event on each of ``datasets`` (the code in place: stock or fixed)."""
    from airflow import settings
    from airflow.datasets.manager import dataset_manager

    with settings.Session() as session:
        for dataset in datasets:
            dataset_manager.register_dataset_change(dataset=dataset, session=session)
        session.commit()


def _stock_loops_until_each_ran(runner, dag_ids: list[str], notes: list[str]) -> int:
    """Stock loops until each of ``dag_ids`` has a queued run, then the runs finished; how many loops."""
    from airflow import settings
    from airflow.utils.state import DagRunState

    loops = 0
    while True:
        with settings.Session() as session:
            if _dataset_triggered_runs(session, dag_ids, DagRunState.QUEUED) >= len(dag_ids):
                break
        if loops > 10 * len(dag_ids):
            raise RuntimeError("the stock scheduler did not give each DAG a run")
        session = settings.Session.session_factory()
        error = scheduler_pass(runner, session)
        session.close()
        if error:
            notes.append(f"upgrade downtime, stock scheduler before the stop: a loop failed: {error}")
        loops += 1
    finish_runs(dag_ids)
    return loops


def _producers(datasets: list[Any], rate: float, stop: threading.Event, seed: int, counts: dict) -> list:
    """``UPGRADE_PRODUCERS`` threads committing ``rate`` transactions a second in all, an outlet each."""

    def produce(index: int) -> None:
        chooser = random.Random(seed + index)
        period = UPGRADE_PRODUCERS / rate
        next_at = time.monotonic() + index * period / UPGRADE_PRODUCERS
        while not stop.is_set():
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += period
            took, error = producer_transaction(chooser.choice(datasets))
            counts["committed" if error is None else "failed"] += 1
            counts["slowest"] = max(counts["slowest"], took)
            if error is not None:
                counts["errors"].append(error)

    threads = [threading.Thread(target=produce, args=(i,), daemon=True) for i in range(UPGRADE_PRODUCERS)]
    for thread in threads:
        thread.start()
    return threads


def bench_upgrade_downtime(
    variants: Variants,
    consumers: int,
    pairs: int,
    minutes: float,
    rate: float,
    late: int,
    history: int,
    seed: int,
    notes: list[str],
    pass_limit: float = 900.0,
    after: float = 30.0,
    variant: str = "fixed",
) -> None:
    """
    ``pairs`` pairs of datasets (x, y) with ``consumers`` DAGs each on ``x | y`` (300 DAGs, 100
    consumers a dataset by default), a history of ``history`` events on each x consumed by their
    runs. Before the stop, on stock Airflow: an event on each x and y and a run of each DAG; an
    event on each x (its queue rows exist); ``late`` producers register on the x datasets in turn
    and hold their transactions open; 5 s later (more than ``commit_latency_seconds``) an event on
    each x and y and a run of each DAG, above the late ones' stamps, which consumes an x event
    stamped after them (no floor of the fix reaches them: only its net). Then every scheduler
    stops for ``minutes``; producers restart with the fix and commit ``rate`` transactions a
    second (an outlet each, on a random dataset of the pairs); the late ones commit spread over
    the stop's first half. Then one fixed scheduler starts (the first: no mark of where the ids
    were followed; ``restart``: a fixed scheduler ran before the stop, and this one reads on from
    its mark) and loops back to back, its runs finished between loops, the producers
    committing for ``after`` more seconds, until each consumer of each late event has consumed
    it and the queue is empty (at most ``pass_limit`` seconds). ``variant`` "stock": the same
    without the fix (producers and scheduler stock: a restart of stock Airflow), until the queue
    is empty. Notes: the counts, the seconds and loops to the late events' consumption and to the
    drain, the loop median, p99 and max, and the invariant after the drain.
    """
    from airflow import settings
    from airflow.datasets import Dataset
    from airflow.datasets.manager import dataset_manager
    from airflow.models.dagrun import DagRun
    from airflow.models.dataset import DatasetDagRunQueue, DatasetEvent, DatasetModel, association_table
    from airflow.models.log import Log
    from sqlalchemy import delete, func, select

    from airflow_dataset_race_fix.diagnostics import invariant

    label = (
        f"upgrade downtime ({variant}), {pairs * consumers} DAGs ({consumers} consumers a dataset), "
        f"{minutes:g} min stop"
    )
    started = time.monotonic()
    prefix = f"{seed}_{variant}"
    xs = [Dataset(f"bench://upgrade/{prefix}/x{p}") for p in range(pairs)]
    ys = [Dataset(f"bench://upgrade/{prefix}/y{p}") for p in range(pairs)]
    names = {
        p: make_consumers(
            f"bench_upgrade_{prefix}_{p}", {f"{c:04d}": xs[p] | ys[p] for c in range(consumers)}
        )
        for p in range(pairs)
    }
    dag_ids = sum(names.values(), [])
    quiet_other_dags(dag_ids)
    with settings.Session() as session:  # a first start of the fix: no mark, no finding
        net = ("dataset-race-fix-followed", "dataset-race-fix-finding")
        session.execute(delete(Log).where(Log.event.in_(net)))
        session.commit()
    if history:
        _write_history(names, [x.uri for x in xs], history)
    log(
        f"  {label}: {len(dag_ids)} DAGs, {history} history events a dataset "
        f"({time.monotonic() - started:.0f} s)"
    )

    # Before the stop: stock producers and a stock scheduler (``restart``: the fix's, which marks where it
    # followed the ids; the late producers are stock's still, dated at their flush, as an older version's).
    before = "fixed" if variant == "restart" else "stock"
    variants.use(before)
    scheduler = new_scheduler_runner()
    _one_transaction(xs + ys)
    _stock_loops_until_each_ran(scheduler, dag_ids, notes)
    _one_transaction(xs)  # the (x, DAG) rows exist: a late producer's ON CONFLICT DO NOTHING waits for none
    held = []
    variants.use("stock")
    for i in range(late):
        session = settings.Session.session_factory()
        event = dataset_manager.register_dataset_change(dataset=xs[i % pairs], session=session)
        session.flush()  # stock: dated now, its id taken; its COMMIT stalls past the stop
        held.append((session, event.id))
    late_ids = [event_id for _, event_id in held]
    variants.use(before)
    time.sleep(5.0)  # more than commit_latency_seconds (3 s)
    _one_transaction(xs + ys)
    loops_before = _stock_loops_until_each_ran(scheduler, dag_ids, notes)
    log(f"  {label}: the last stock runs made ({loops_before} loops); {late} producers hold late events")

    # The stop: no scheduler; producers restarted (with the fix, or stock again); the late ones commit in its
    # first half.
    variants.use("stock" if variant == "stock" else "fixed")
    counts: dict[str, Any] = {"committed": 0, "failed": 0, "slowest": 0.0, "errors": []}
    stop = threading.Event()
    threads = _producers(xs + ys, rate, stop, seed, counts)
    stop_began, downtime = time.monotonic(), minutes * 60
    for i, (session, _) in enumerate(held):
        time.sleep(max(0.0, stop_began + downtime / 2 * (i + 1) / (late + 1) - time.monotonic()))
        session.commit()
        session.close()
    time.sleep(max(0.0, stop_began + downtime - time.monotonic()))
    with settings.Session() as session:
        newest = session.scalar(select(func.max(DatasetEvent.id)))
        behind = [newest - event_id for event_id in late_ids]
    during_stop = counts["committed"]
    log(
        f"  {label}: the stop is over: {during_stop} transactions committed, "
        f"{counts['failed']} failed; the late ids lie {min(behind)}-{max(behind)} ids below the newest"
    )

    # One scheduler starts; the producers go on for ``after`` seconds.
    def consumers_of_late() -> int:
        with settings.Session() as session:
            return session.scalar(
                select(func.count())
                .select_from(association_table)
                .where(association_table.c.event_id.in_(late_ids))
            )

    def found_or_consumed() -> int:
        """(late event, consumer) pairs consumed, or with a finding kept (one a DAG and dataset, the oldest
        of a look: the DAG's next read starts at or below its stamp)."""
        with settings.Session() as session:
            events = session.execute(
                select(DatasetEvent.id, DatasetModel.uri, DatasetEvent.timestamp)
                .join(DatasetModel, DatasetModel.id == DatasetEvent.dataset_id)
                .where(DatasetEvent.id.in_(late_ids))
            ).all()
            found = session.execute(
                select(Log.dag_id, Log.map_index, Log.execution_date).where(
                    Log.event == "dataset-race-fix-finding"
                )
            ).all()
            links = session.execute(
                select(association_table.c.event_id, DagRun.dag_id)
                .join(DagRun, DagRun.id == association_table.c.dag_run_id)
                .where(association_table.c.event_id.in_(late_ids))
            ).all()
            dataset_ids = dict(session.execute(select(DatasetModel.uri, DatasetModel.id)).all())
        consumed, pairs = {tuple(row) for row in links}, 0
        for event_id, uri, stamp in events:
            for dag_id in names[[x.uri for x in xs].index(uri)]:
                pairs += (event_id, dag_id) in consumed or any(
                    row[0] == dag_id and row[1] == dataset_ids[uri] and row[2] <= stamp for row in found
                )
        return pairs

    runner, laps, consumed_after, drained_after, found_after = new_scheduler_runner(), [], None, None, None
    late_queue, probe_sizes, net_took = [], [], []
    if variant != "stock":  # the net's own time in each loop (its looks, findings and sweep)
        untimed = runner._dags_with_unqueued_dataset_events

        def timed_net(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return untimed(*args, **kwargs)
            finally:
                net_took.append(time.perf_counter() - started)

        runner._dags_with_unqueued_dataset_events = timed_net
    began = time.monotonic()
    while time.monotonic() - began < pass_limit:
        session = settings.Session.session_factory()
        loop_began = time.perf_counter()
        error = scheduler_pass(runner, session)
        laps.append(time.perf_counter() - loop_began)
        session.close()
        if error:
            notes.append(f"{label}: a loop failed: {error}")
        finish_runs(dag_ids)
        net = runner.__dict__.get("_dataset_race_fix_net")  # (fixed: the net's, as it goes)
        late_queue.append(len(net.late) + len(net.below) if net is not None else 0)
        probe_sizes.append(net.probe_size if net is not None else 0)
        if found_after is None and found_or_consumed() >= late * consumers:
            found_after = (len(laps), time.monotonic() - began)
        if consumed_after is None and consumers_of_late() >= late * consumers:
            consumed_after = (len(laps), time.monotonic() - began)
            log(f"  {label}: every late event consumed after {consumed_after[1]:.1f} s")
        if not stop.is_set() and time.monotonic() - began >= after:
            stop.set()
            for thread in threads:
                thread.join()
            log(f"  {label}: the producers stop after {time.monotonic() - began:.1f} s")
        if stop.is_set() and drained_after is None:
            with settings.Session() as session:
                left = session.scalar(
                    select(func.count()).where(DatasetDagRunQueue.target_dag_id.in_(dag_ids))
                )
            if not left:
                drained_after = (len(laps), time.monotonic() - began)
                log(f"  {label}: the queue is empty after {drained_after[1]:.1f} s")
        if drained_after and (consumed_after or variant == "stock"):
            break
    stop.set()
    for thread in threads:
        thread.join()
    with settings.Session() as session:
        report = invariant.check(session, dag_ids)
    variants.use("stock")

    def figures(values: list[float]) -> str:
        return (
            f"median {statistics.median(values) * 1000:.1f} ms, p99 {p99(values) * 1000:.1f} ms, "
            f"max {max(values) * 1000:.1f} ms over {len(values)} loops"
        )

    notes.append(
        f"{label}: {during_stop} producer transactions committed during the stop, "
        f"{counts['committed'] - during_stop} in the {after:g} s after it ({rate:g}/s, "
        f"{counts['failed']} failed, slowest {counts['slowest']:.2f} s); {late} late events, "
        f"ids {min(behind)}-{max(behind)} below the newest when the scheduler started"
    )
    if consumed_after is None:
        notes.append(
            f"{label}: the late events NOT all consumed ({time.monotonic() - began:.0f} s after the start): "
            f"{consumers_of_late()} of {late * consumers} (event, consumer) pairs"
        )
    else:
        notes.append(
            f"{label}: every late event found for (or consumed by) each of its consumers "
            f"{found_after[1]:.1f} s after the scheduler's start, in loop {found_after[0]}; consumed by each "
            f"{consumed_after[1]:.1f} s after it, in loop {consumed_after[0]}; loops until then: "
            f"{figures(laps[: consumed_after[0]])}"
        )
    if variant != "stock":
        notes.append(
            f"{label}: the net's late events to probe: {max(late_queue)} at most (after loop "
            f"{late_queue.index(max(late_queue)) + 1}), {late_queue[-1]} at the end; its probe size a look: "
            f"{min(probe_sizes)}-{max(probe_sizes)}, median {statistics.median(probe_sizes):g}; its time in "
            f"the first loop {net_took[0] * 1000:.1f} ms, then {figures(net_took[1:] or [0.0])}"
        )
    notes.append(
        f"{label}: the queue empty "
        + (
            f"{drained_after[1]:.1f} s after the start, loop {drained_after[0]}; loops until then: "
            f"{figures(laps[: drained_after[0]])}"
            if drained_after
            else "never"
        )
        + f"; all loops: {figures(laps)}; after the drain: {report.totals()}"
    )
