"""
Rounds of producer processes beside a scheduler thread, shared by the busy-dataset and fleet cases:
what a variant's rounds measured, the invariant checker's count after the drain, and the rows.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from reproduce.benchmark.figures import ms_line, p99, percentile, pooled_row
from reproduce.benchmark.runner import log
from reproduce.benchmark.scheduler import finish_runs, scheduler_pass
from reproduce.benchmark.world import analyze


class TooFewSamples(Exception):
    """A case measured nothing to compare: its message goes into the report instead of its rows."""


class RoundsResult:
    """What one variant's rounds of the busy-dataset case measured."""

    def __init__(self) -> None:
        self.loops: list[float] = []  # steady-state passes
        self.round_medians: list[float | None] = []  # per round, for the paired ratio
        self.latencies: list[float] = []  # committed producer transactions
        self.visible_after: list[float] = []  # their events: seconds from timestamp to visible
        self.errors: list[str] = []  # appended to by several threads (a list append is atomic)
        self.lost = self.unconsumed = self.doubled = 0  # from the invariant checker, after the drain

    @property
    def failed(self) -> int:
        """Failed transactions of the busy dataset's producers."""
        return sum(1 for error in self.errors if error.startswith("producer: "))


def round_beside_a_scheduler(
    runner,
    dag_ids: list[str],
    rate: int,
    producers: int,
    seconds: float,
    result: RoundsResult,
    commit: Callable[[int], Callable[[], tuple[float, str | None]]],
    before_pass: Callable[[], None] = lambda: None,
) -> None:
    """
    ``seconds`` of a scheduler thread running passes (``before_pass()`` before each, runs finished after)
    while ``producers`` processes run ``commit(n)()`` at ``rate`` transactions a second in all; into
    ``result``.

    Producers are processes, as tasks are: threads beside the scheduler's would wait for its
    thread's GIL after every round trip (up to ``sys.getswitchinterval()``, 5 ms), which no
    task feels and which charged each extra statement 5 ms (docs/measurements.md).
    """
    import multiprocessing
    import threading

    from airflow import settings

    context = multiprocessing.get_context("fork")  # the variant in place and the world's settings go with it
    stop = context.Event()
    reports = context.Queue()
    passes: list[float] = []  # seconds

    def producer(n: int) -> None:
        settings.engine.dispose(close=False)  # the parent's pooled connections stay the parent's
        transaction = commit(n)
        latencies: list[float] = []
        errors: list[str] = []
        interval = producers / rate  # each process's share of the rate
        next_at = time.monotonic() + interval * n / producers  # staggered
        while not stop.is_set():
            if stop.wait(max(0.0, next_at - time.monotonic())):
                break
            next_at = max(next_at + interval, time.monotonic())  # behind schedule: no catch-up burst
            elapsed, error = transaction()
            if error:
                errors.append(f"producer: {error}")
            else:
                latencies.append(elapsed)
        reports.put((latencies, errors, result.visible_after))  # this process's copy of result

    def scheduler() -> None:
        session = settings.Session.session_factory()
        while not stop.is_set():
            before_pass()
            started = time.perf_counter()
            error = scheduler_pass(runner, session)
            elapsed = time.perf_counter() - started
            if error:
                result.errors.append(f"scheduler: {error}")
            else:
                passes.append(elapsed)
            finish_runs(dag_ids)
        session.close()

    processes = [context.Process(target=producer, args=(n,)) for n in range(producers)]
    for process in processes:  # forked before the scheduler thread starts: one thread to copy
        process.start()
    thread = threading.Thread(target=scheduler)
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join()
    visible_before = len(result.visible_after)
    for _ in processes:
        latencies, errors, visible_after = reports.get(timeout=120)
        result.latencies += latencies
        result.errors += errors
        result.visible_after += visible_after[visible_before:]
    for process in processes:
        process.join()
        if process.exitcode:
            result.errors.append(f"producer: process exited with {process.exitcode}")
    steady = passes[1:]  # the first pass after the switch of variant apart
    result.loops += steady
    result.round_medians.append(statistics.median(steady) if steady else None)


def count_findings(
    label: str, results: dict[str, RoundsResult], dag_ids_of: dict[str, list[str]], since: datetime
) -> None:
    """After the drain: each variant's lost, doubled and unconsumed events (the invariant checker), its
    errors logged."""
    from airflow import settings

    from airflow_dataset_race_fix.diagnostics import invariant

    analyze()  # the checker's plans need fresh statistics (the cases' loops are measured before it)
    for variant, dag_ids in dag_ids_of.items():
        with settings.Session() as session:
            report = invariant.check(session, dag_ids, since=since)
        result = results[variant]
        result.lost, result.doubled = report.total("lost"), report.total("doubled")
        result.unconsumed = report.total("produced") - report.total("consumed")
        if result.errors:
            log(f"  {label}, {variant}: {len(result.errors)} error(s), e.g. {result.errors[:3]}")


def rounds_rows(
    label: str, rate: int, seconds: float, results: dict[str, RoundsResult], loop_target: float = 1.2
) -> list[dict[str, Any]]:
    stock, fixed = results["stock"], results["fixed"]
    if not stock.loops or not fixed.loops or not stock.latencies or not fixed.latencies:
        raise TooFewSamples(
            f"{label}: too few samples (steady passes stock {len(stock.loops)}, fixed "
            f"{len(fixed.loops)}): make the rounds longer (--busy-dataset-seconds)"
        )
    pairs = [f / s for s, f in zip(stock.round_medians, fixed.round_medians) if s and f]
    summary = {
        "rate": rate,
        "loop_target": loop_target,
        "committed": {v: len(r.latencies) for v, r in results.items()},
        "events_per_second": {v: len(r.latencies) / seconds for v, r in results.items()},
        "failed": {v: r.failed for v, r in results.items()},
        "lost": {v: r.lost for v, r in results.items()},
        "unconsumed": {v: r.unconsumed for v, r in results.items()},
        "doubled": {v: r.doubled for v, r in results.items()},
        "steady_passes": {v: len(r.loops) for v, r in results.items()},
        "visible_after_ms": {
            v: {
                "p50": statistics.median(r.visible_after) * 1000,
                "p99": p99(r.visible_after) * 1000,
                "max": max(r.visible_after) * 1000,
            }
            for v, r in results.items()
            if r.visible_after
        },
    }
    rows = [
        {
            **pooled_row(
                f"{label}: scheduler loop, median",
                statistics.median(stock.loops),
                statistics.median(fixed.loops),
                len(stock.loops),
            ),
            "ratio": statistics.median(pairs) if pairs else float("nan"),
            "busy_dataset": summary,
        },
        pooled_row(
            f"{label}: scheduler loop, p90",
            percentile(stock.loops, 0.9),
            percentile(fixed.loops, 0.9),
            len(stock.loops),
        ),
        pooled_row(
            f"{label}: producer transaction, p50",
            statistics.median(stock.latencies),
            statistics.median(fixed.latencies),
            len(stock.latencies),
        ),
        pooled_row(
            f"{label}: producer transaction, p99",
            p99(stock.latencies),
            p99(fixed.latencies),
            len(stock.latencies),
        ),
    ]
    if stock.visible_after and fixed.visible_after:  # stock: flush to visible; fixed: stamp to visible
        rows.append(
            pooled_row(
                f"{label}: event timestamp to visible, max",
                max(stock.visible_after),
                max(fixed.visible_after),
                len(stock.visible_after),
            )
        )
    for row in rows:
        log(f"  {row['case']}: {ms_line(row)}")
    return rows
