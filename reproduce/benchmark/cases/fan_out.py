"""
``fan-out``: consumers x datasets x events consumed in the window; loops of a stock and a fixed
scheduler just started, the fixed one's until its net has caught up (a first start reads the
last 10 000 event ids again), long-running ones after it and a sweep round's loops: median, p99,
max, the net's and sweep's share.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from reproduce.benchmark.figures import p99, pooled_row
from reproduce.benchmark.runner import VARIANTS, Variants, log, pair_order
from reproduce.benchmark.scheduler import net_caught_up, new_scheduler_runner, scheduler_pass
from reproduce.benchmark.world import consumed_run_row, event_rows, make_consumers, quiet_other_dags

FANOUT_WINDOW_SECONDS = 800  # inside event_lookback_seconds (900)

FANOUT_RUN_EVENTS = 100  # events a historical run consumed


def bench_fanout(
    variants: Variants,
    consumers: int,
    datasets: int,
    events: int,
    loops: int,
    notes: list[str],
    pass_limit: float = 900.0,
    pace: float = 0.0,
) -> list[dict[str, Any]]:
    """
    The fan-out: ``datasets`` datasets with ``consumers`` DAGs each and ``events`` events per dataset
    over the last 800 s, each consumed by a run of every consumer (100 a run): consumers x events links a
    dataset. Tables never analyzed (as a bulk load or a restore leaves them). Per variant a new scheduler
    runner (a scheduler just started: its first loop apart) runs ``loops`` loops; both run on until the fixed
    one's net has caught up (at most ``pass_limit`` seconds), then each runs ``2 * loops`` more (long-running)
    and a sweep round's. Nothing new happens, so a loop is the scheduler's heartbeat and the fix's net all it
    adds. ``pace``: seconds from one pair of loops to the next (1: a loop a second, as an idle scheduler
    sleeps; 0: back to back). Rows: the loop's median; notes: its p99, max and the net's and sweep's share of
    the fixed loops' time.
    """
    from airflow import settings
    from airflow.datasets import Dataset
    from airflow.models.dagrun import DagRun
    from airflow.models.dataset import DatasetEvent, DatasetModel
    from sqlalchemy import insert, select, text

    started = time.monotonic()
    uris = [f"bench://fanout/{d:02d}" for d in range(datasets)]
    schedules = {f"{d:02d}_{c:04d}": [Dataset(uris[d])] for d in range(datasets) for c in range(consumers)}
    names = make_consumers("bench_fanout", schedules)
    quiet_other_dags(names)
    end = datetime.now(timezone.utc) - timedelta(seconds=5)
    step = timedelta(seconds=FANOUT_WINDOW_SECONDS) / events
    with settings.Session() as session:
        dataset_ids = dict(
            session.execute(select(DatasetModel.uri, DatasetModel.id).where(DatasetModel.uri.in_(uris))).all()
        )
        for d, uri in enumerate(uris):
            instants = [end - step * (events - i) for i in range(events)]
            for start in range(0, events, 5000):
                session.execute(
                    insert(DatasetEvent),
                    event_rows(dataset_ids[uri], instants[start : start + 5000], "bench_fanout"),
                )
            batches = [instants[i : i + FANOUT_RUN_EVENTS] for i in range(0, events, FANOUT_RUN_EVENTS)]
            for c in range(consumers):
                session.execute(
                    insert(DagRun),
                    [consumed_run_row(f"bench_fanout_{d:02d}_{c:04d}", b[0], b[-1]) for b in batches],
                )
            # every consumer's runs consumed the events of their interval: consumers x events links
            session.execute(
                text(
                    "INSERT INTO dagrun_dataset_event (dag_run_id, event_id) SELECT r.id, e.id "
                    "FROM dag_run r JOIN dataset_event e ON e.dataset_id = :dataset_id "
                    "AND e.timestamp >= r.data_interval_start AND e.timestamp <= r.data_interval_end "
                    "WHERE r.dag_id LIKE :consumers"
                ),
                {"dataset_id": dataset_ids[uri], "consumers": f"bench_fanout_{d:02d}_%"},
            )
            session.commit()
    log(
        f"  {consumers} consumers x {datasets} datasets, {events} events each, "
        f"{consumers * events * datasets} links ({time.monotonic() - started:.0f} s to write)"
    )
    runners, net_seconds, current = {}, [0.0], [""]
    for variant in VARIANTS:  # one scheduler process each, started together
        variants.use(variant)
        runners[variant] = new_scheduler_runner()
    net = runners["fixed"]._dags_with_unqueued_dataset_events  # the net, the sweep and their DAGs' check

    def timed_net(*args: Any, **kwargs: Any) -> Any:  # the net's own time, from inside the loop
        began = time.perf_counter()
        try:
            return net(*args, **kwargs)
        finally:
            net_seconds[0] += time.perf_counter() - began

    runners["fixed"]._dags_with_unqueued_dataset_events = timed_net

    stock_took = [0.0]  # stock's loop time since the fixed runner's last loop

    def loop(variant: str) -> tuple[float, float]:
        """One loop of ``variant``'s runner: its time and the net's in it."""
        if current[0] != variant:  # a cheap switch: the runners' loops alternate one by one
            variants.switch(variant)
            current[0] = variant
        if variant == "fixed":
            # The fix's paced steps earn 3 % of the time since their last call: not of the time stock's
            # loops took here (a scheduler alone has no such gap), but of any pace's sleep, as in a scheduler.
            sweep = runners["fixed"].__dict__.get("_dataset_race_fix_sweep")
            if sweep is not None and sweep.credit_at is not None:
                sweep.credit_at += stock_took[0]
            stock_took[0] = 0.0
        session, net_before = settings.Session.session_factory(), net_seconds[0]
        # this process's heap (the lab's, not a scheduler's) made gen-2 pauses of 100 ms fall in loops
        gc.disable()
        began = time.perf_counter()
        error = scheduler_pass(runners[variant], session)
        took = time.perf_counter() - began
        gc.enable()
        session.close()
        if variant == "stock":
            stock_took[0] += took
        if error:
            notes.append(f"fan-out, {variant}: a loop failed: {error}")
        return took, net_seconds[0] - net_before

    def in_turn(phase: str, loops: int, until: Callable[[], bool] | None = None) -> int:
        """A loop of each runner in turn, the order flipped each pair (ABBA): ``loops`` each, or fixed's
        ``until``."""
        done = 0
        while (done < loops) if until is None else not until() and done < loops:
            pair_began = time.monotonic()
            for variant in pair_order(done + 1):  # fixed first in the first pair
                laps[variant][phase].append(loop(variant))
            done += 1
            time.sleep(max(0.0, pace - (time.monotonic() - pair_began)))
        return done

    def pass_done() -> bool:  # the start behind: its re-read of the last ids, every late one probed, and the
        # sweep's first round (it reads every DAG; idle, the rounds after read only DAGs new since)
        sweep = runners["fixed"].__dict__.get("_dataset_race_fix_sweep")
        first_round_over = sweep is not None and sweep.dag_ids is not None and not sweep.todo
        return first_round_over and net_caught_up(runners["fixed"])

    # Phases, a loop of each runner in turn, ABBA (a shared machine's load falls on both alike): stock and
    # fixed just started (first loop apart), on until the fixed one's net has caught up (or pass_limit
    # seconds), then long-running; last, the fix's sweep: a round set due and the loops until it is over (its
    # pages paced by its credit, as in a scheduler alone: the credit does not earn from stock's loops).
    laps: dict[str, dict[str, list[tuple[float, float]]]] = {v: defaultdict(list) for v in VARIANTS}
    for variant in VARIANTS:
        laps[variant]["first"].append(loop(variant))
    in_turn("restarted", loops)
    pass_started = time.monotonic()
    in_turn("pass", 10**9, lambda: pass_done() or time.monotonic() - pass_started >= pass_limit)
    pass_seconds, pass_over = time.monotonic() - pass_started, pass_done()
    if not pass_over:  # a long-running scheduler has the start behind it: the rest skipped, its rate noted
        state = runners["fixed"].__dict__["_dataset_race_fix_net"]
        notes.append(
            f"fan-out: the net not caught up after {pass_seconds:.0f} s "
            f"({len(laps['fixed']['pass'])} loops): {len(state.late) + len(state.below)} late events left "
            f"to probe "
            f"({state.probe_size} a look at its end); the rest skipped"
        )
        state.late, state.below = [], []
    in_turn("running", 2 * loops)
    sweep = runners["fixed"].__dict__["_dataset_race_fix_sweep"]
    # a round due now (at once, credit allowing) that reads every DAG, as one after a change does
    sweep.at, sweep.full_at = float("-inf"), float("-inf")
    round_loops = in_turn("sweep", 20 * loops, lambda: sweep.at != float("-inf") and not sweep.todo)
    notes.append(
        f"fan-out: a sweep round over {consumers * datasets} DAGs took {round_loops} of the fixed loops "
        f"(pages of {sweep.size} DAGs at its end)"
    )
    variants.switch("stock")
    label = f"fan-out {consumers} x {datasets} datasets, {events} events each"
    if pace:
        label += f", a pair of loops each {pace:g} s"
    during = laps["fixed"]["pass"]
    during_times = [t for t, _ in during]
    notes.append(
        f"{label}: the net's start {'took' if pass_over else 'not over in'} {pass_seconds:.1f} s, "
        f"{len(during)} fixed loops after the just-started ones"
        + (
            f": loop median {statistics.median(during_times) * 1000:.2f} ms, "
            f"p99 {p99(during_times) * 1000:.1f} ms, max {max(during_times) * 1000:.1f} ms, "
            f"the net {sum(n for _, n in during) / sum(during_times):.1%}"
            if during
            else ""
        )
    )
    rows = []
    for phase, what in (
        ("first", "first loop"),
        ("restarted", "just started"),
        ("pass", "while the net catches up and the first sweep round reads every DAG"),
        ("running", "long-running"),
        ("sweep", "a sweep round that reads every DAG (after a change)"),
    ):
        stock, fixed = ([t for t, _ in laps[v][phase]] for v in VARIANTS)
        if not stock:  # (the pass over in the just-started loops)
            continue
        rows.append(
            pooled_row(f"{label}: {what}", statistics.median(stock), statistics.median(fixed), len(stock))
        )
        share = sum(n for _, n in laps["fixed"][phase]) / sum(fixed)
        rest = statistics.median(
            t - n for t, n in laps["fixed"][phase]
        )  # the fixed loop but the net and sweep
        notes.append(
            f"{label}, {what}: the fixed loop's median without the net and sweep {rest * 1000:.2f} ms; "
            f"p99 stock {p99(stock) * 1000:.1f} ms, fixed {p99(fixed) * 1000:.1f} ms; "
            f"max stock {max(stock) * 1000:.1f} ms, fixed {max(fixed) * 1000:.1f} ms; "
            f"the net and sweep {share:.1%} of the fixed loops' time"
        )
    return rows
