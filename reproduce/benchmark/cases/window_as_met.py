"""``window-as-met``: the look-back window as users meet it: statistics never taken, behind a load, fresh."""

from __future__ import annotations

import gc
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from reproduce.benchmark.figures import ms_line, paired_row, percentile
from reproduce.benchmark.producers import commit_new_events
from reproduce.benchmark.runner import VARIANTS, Variants, in_rounds, log
from reproduce.benchmark.scheduler import new_scheduler_runner, runs_created
from reproduce.benchmark.world import (
    ANALYZED,
    STATISTICS_STATES,
    add_consumed_events,
    analyze,
    evenly_before,
    id_of,
    make_consumers,
    quiet_other_dags,
)


def bench_window_as_met(
    variants: Variants,
    windows: tuple[int, ...],
    samples: int,
    notes: list[str],
    loops: int = 4,
    states: tuple[str, ...] = STATISTICS_STATES,
) -> list[dict[str, Any]]:
    """
    The look-back window as users meet it (issues 30, 49): history just bulk-loaded on tables
    never analyzed (a restore or a new server's bulk load with autovacuum off; only while no
    earlier case of the run took statistics), with the planner's statistics taken before the
    load ("behind"; a backfill, a lagging auto-analyze), then after ANALYZE ("fresh"). Each
    sample is a new scheduler runner (a process just started: its first loop, with the sweep
    and the net, reported apart) and ``loops - 1`` loops after it; whole loops
    (``_create_dagruns_for_dags``), each rolled back. Stock and fixed alternate sample by
    sample (ABBA), on the same database.
    """
    from airflow import settings
    from airflow.datasets import Dataset

    class _NoCommit:  # the loop's own commit becomes a flush: every loop is rolled back
        def __init__(self, session) -> None:
            self.session = session

        def commit(self) -> None:
            self.session.flush()

    def one_loop(runner, dag_id: str) -> float:
        session = settings.Session.session_factory()
        try:
            started = time.perf_counter()
            runner._create_dagruns_for_dags(guard=_NoCommit(session), session=session)
            elapsed = time.perf_counter() - started
            if runs_created(session, [dag_id]) != 1:
                raise AssertionError("the loop created no run for the window's DAG")
            return elapsed
        finally:
            session.rollback()
            session.close()

    def load(size: int, name: str) -> str:
        dataset = Dataset(f"bench://window-as-met/{name}/{size}")
        (dag_id,) = make_consumers(f"bench_met_{name}_{size}", {"single_a": [dataset]})
        dataset_id = id_of(dataset)
        if name == "behind":
            analyze()  # statistics of the tables before this load: they fall behind it
        end = datetime.now(timezone.utc) - timedelta(seconds=30)
        add_consumed_events(dag_id, dataset_id, evenly_before(end, timedelta(minutes=10), size))
        quiet_other_dags([dag_id])
        commit_new_events(variants, [dataset])  # every loop rolls back
        return dag_id

    def measure(size: int, dag_id: str, state: str) -> list[dict[str, Any]]:
        first: dict[str, list[float]] = {v: [] for v in VARIANTS}
        after: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for _, variant in in_rounds(variants, samples):
            runner = new_scheduler_runner()
            gc.collect()
            first[variant].append(one_loop(runner, dag_id))
            after[variant] += [one_loop(runner, dag_id) for _ in range(loops - 1)]
        rows = []
        for label, times in (("first loop of a new scheduler", first), ("loops after the first", after)):
            row = paired_row(f"window of {size} consumed events, {state}, {label}", times)
            row["window_as_met"] = {
                "p90_ratio": percentile(times["fixed"], 0.9) / percentile(times["stock"], 0.9),
                "stock_p90_ms": percentile(times["stock"], 0.9) * 1000,
                "fixed_p90_ms": percentile(times["fixed"], 0.9) * 1000,
            }
            log(
                f"  {row['case']}: {ms_line(row)}; p90 stock {row['window_as_met']['stock_p90_ms']:.2f} ms, "
                f"fixed {row['window_as_met']['fixed_p90_ms']:.2f} ms, "
                f"ratio {row['window_as_met']['p90_ratio']:.2f}"
            )
            rows.append(row)
        return rows

    rows = []
    if "never analyzed" in states and ANALYZED:
        notes.append(
            "window as met, never analyzed: not measured, an earlier case of this run took statistics "
            "(run --cases window-as-met alone)"
        )
    elif "never analyzed" in states:
        for size in windows:  # every load before any ANALYZE
            rows += measure(size, load(size, "never"), "never analyzed")
    for size in windows if {"behind", "fresh"} & set(states) else ():
        dag_id = load(size, "behind")
        if "behind" in states:
            rows += measure(size, dag_id, "statistics behind")
        if "fresh" in states:
            analyze()
            rows += measure(size, dag_id, "fresh statistics")
    return rows
