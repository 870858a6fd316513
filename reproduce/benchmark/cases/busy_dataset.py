"""
``busy-dataset``: 4 rate-limited producer processes commit continuously to one dataset (50 and 200
events/s in all) while a scheduler thread runs its real loop for that dataset's consumer DAG and 10
other DAGs, each with a new event every pass, over a look-back window already dense with 50 000
consumed events, its last commit_latency_seconds topped up to the rate before each round. Loop time
(median, p90), producer transaction latency (p50, p99), failed producer transactions, and the events
lost or doubled, counted by the invariant checker after the scheduler drained the queue. The loop
figures leave out each round's first pass only: the safety net's slices and a DAG's full reads are in
them, as a user's loop has them; statistics taken behind the history's load and fresh, a case each.
With default sizes it takes about 1.5 minutes (PostgreSQL, MariaDB, quiet machine).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any

from reproduce.benchmark.producers import producer_transaction
from reproduce.benchmark.rounds import (
    RoundsResult,
    TooFewSamples,
    count_findings,
    round_beside_a_scheduler,
    rounds_rows,
)
from reproduce.benchmark.runner import VARIANTS, Variants, in_rounds, log
from reproduce.benchmark.scheduler import drain, new_scheduler_runner
from reproduce.benchmark.world import (
    ANALYZED,
    add_consumed_events,
    analyze,
    evenly_before,
    id_of,
    make_consumers,
    quiet_other_dags,
    unpause_only,
)

BUSY_OTHER_DAGS = 10  # ready DAGs beside the busy dataset's consumer, each with a new event every pass

BUSY_DATASET_STATES = ("behind", "fresh")

BUSY_DATASET_ON_SQLITE = (
    "busy dataset on sqlite: one writer, so the producers and the scheduler take turns "
    "(the rate may not be reached: see the events committed)"
)


def bench_busy_dataset(
    variants: Variants,
    rates: tuple[int, ...],
    rounds: int,
    round_seconds: float,
    history: int,
    notes: list[str],
    producers: int = 4,
    states: tuple[str, ...] = BUSY_DATASET_STATES,
) -> list[dict[str, Any]]:
    """
    Producer processes commit continuously to one dataset (``rate`` events/s in all) while a
    scheduler thread runs its real loop for that dataset's consumer DAG and 10 other DAGs.

    Each (statistics state, rate) has its own DAGs and datasets, one copy per variant (the
    other copies are paused during a round), so that each is drained by its own code and
    judged by the invariant checker on its own events. Both copies start with ``history``
    events of the last ten minutes on the busy dataset, each consumed by a past run (a dense
    look-back window), and before each round its last commit_latency_seconds are topped up
    to ``rate`` (see ``top_up_recent_events``). The planner's statistics are taken after that
    load ("fresh") or before it ("behind": a new DAG's runs and events the statistics have
    never seen, as after a bulk load or a restore with autovacuum not there yet), or never
    taken ("never analyzed": only while no earlier case of the run took statistics).
    Rounds alternate stock, fixed, fixed, stock, ...; after each round the producers stop
    and the scheduler drains the queue. The scheduler finishes its runs after each pass,
    as the real one would run them. Loop times leave out each round's first pass (after
    the switch of variant) and nothing else: the net's slices and the full reads it asks
    for are part of a loop. A rate whose rounds left no steady pass to compare gets a line
    in ``notes`` instead of rows.
    """
    from airflow.models.dag import DagModel

    from airflow_dataset_race_fix.fix.datasets.manager import DatasetManager as FixedManager

    commit_latency = FixedManager._dataset_race_fix_setting("commit_latency_seconds")
    saved, DagModel.NUM_DAGS_PER_DAGRUN_QUERY = DagModel.NUM_DAGS_PER_DAGRUN_QUERY, BUSY_OTHER_DAGS + 1
    rows = []
    try:
        for state in states:
            for rate in rates:
                if state == "never analyzed" and ANALYZED:  # the checker of an earlier case took statistics
                    notes.append(
                        f"busy dataset, {rate} events/s, never analyzed: not measured, an earlier case "
                        "of this run took statistics (run one rate, --cases busy-dataset alone)"
                    )
                    continue
                rows += _busy_dataset_case(
                    variants, state, rate, rounds, round_seconds, history, notes, producers, commit_latency
                )
    finally:
        DagModel.NUM_DAGS_PER_DAGRUN_QUERY = saved
        variants.use("stock")
    return rows


def _busy_dataset_case(
    variants: Variants,
    state: str,
    rate: int,
    rounds: int,
    round_seconds: float,
    history: int,
    notes: list[str],
    producers: int,
    commit_latency: float,
) -> list[dict[str, Any]]:
    from airflow.datasets import Dataset

    copies: dict[str, tuple[Dataset, Dataset, list[str]]] = {}
    busy_ids: dict[str, int] = {}
    started = time.monotonic()
    if state == "behind":
        analyze()  # statistics of the tables before this load: they never see it
    end = datetime.now(timezone.utc) - timedelta(seconds=5)
    instants = evenly_before(end, timedelta(minutes=10), history)
    for variant in VARIANTS:
        uri = f"bench://busy-dataset/{state}/{rate}/{variant}"
        busy, other = Dataset(uri), Dataset(f"{uri}/other")
        names = make_consumers(
            f"bench_busy_{state}_{rate}_{variant}",
            {"busy": [busy], **{f"other{i:02d}": [other] for i in range(BUSY_OTHER_DAGS)}},
        )
        busy_id = id_of(busy)
        add_consumed_events(names[0], busy_id, instants)
        copies[variant], busy_ids[variant] = (busy, other, names), busy_id
    if state == "fresh":
        analyze()
    log(
        f"  statistics {state}, {rate} events/s: {history} consumed events per variant "
        f"({time.monotonic() - started:.0f} s to load)"
    )
    quiet_other_dags([name for *_, names in copies.values() for name in names])
    runner = new_scheduler_runner()  # a new scheduler process: its first pass per DAG reads in full
    since = datetime.now(timezone.utc) - timedelta(seconds=1)
    results = {v: RoundsResult() for v in VARIANTS}
    for _, variant in in_rounds(variants, rounds):
        busy, other, names = copies[variant]
        others = [name for v, (*_, dag_ids) in copies.items() if v != variant for name in dag_ids]
        unpause_only(names, others)
        top_up_recent_events(names[0], busy_ids[variant], rate, commit_latency)
        _busy_dataset_round(runner, busy, other, names, rate, producers, round_seconds, results[variant])
        results[variant].errors += drain(runner, names)
    label = f"busy dataset, {rate} events/s, statistics {state}"
    count_findings(label, results, {variant: names for variant, (*_, names) in copies.items()}, since)
    try:
        return rounds_rows(label, rate, rounds * round_seconds, results)
    except TooFewSamples as err:
        notes.append(str(err))
        return []


def top_up_recent_events(dag_id: str, dataset_id: int, rate: int, seconds: int) -> None:
    """
    Consumed events on the dataset so that its last ``seconds`` hold ``rate`` events a second.

    As if the dataset had been this busy all along: the fixed scheduler's steady state reads
    the consumed events of its last commit_latency_seconds, and short rounds, half of them
    the other variant's, would otherwise leave that stretch thinner than the rate makes it.
    The new events lie after the dataset's newest history event (``add_history`` must not
    meet its own earlier events).
    """
    from airflow import settings
    from airflow.models.dataset import DatasetEvent
    from sqlalchemy import func, select

    now = datetime.now(timezone.utc)
    with settings.Session() as session:
        present = session.scalar(
            select(func.count()).where(
                DatasetEvent.dataset_id == dataset_id,
                DatasetEvent.timestamp >= now - timedelta(seconds=seconds),
            )
        )
        newest_history = session.scalar(
            select(func.max(DatasetEvent.timestamp)).where(
                DatasetEvent.dataset_id == dataset_id, DatasetEvent.source_dag_id == "bench_history"
            )
        )
    missing = rate * seconds - present
    start = max(now - timedelta(seconds=seconds), newest_history + timedelta(milliseconds=1))
    span = now - timedelta(milliseconds=100) - start
    if missing > 0 and span > timedelta(0):
        instants = [start + span * i / missing for i in range(missing)]
        add_consumed_events(dag_id, dataset_id, instants)


def _busy_dataset_round(
    runner, busy, other, dag_ids: list[str], rate: int, producers: int, seconds: float, result: RoundsResult
) -> None:
    def before_pass() -> None:
        if error := producer_transaction(other)[1]:  # the 10 other DAGs get a new event every pass
            result.errors.append(f"other producer: {error}")

    round_beside_a_scheduler(
        runner,
        dag_ids,
        rate,
        producers,
        seconds,
        result,
        commit=lambda n: lambda: producer_transaction(busy, visible_after=result.visible_after),
        before_pass=before_pass,
    )
