"""
``mixed-upgrade``: the upgrade's mixed states, fixed producers beside a stock scheduler and the reverse,
against all stock and all fixed; tasks with two outlets in either order, no retries: failed producer
transactions, and events lost or doubled after the drain (the mixed state also after a fixed
scheduler's drain). About 25 seconds a round.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

from reproduce.benchmark.producers import run_beside_a_scheduler
from reproduce.benchmark.runner import Variants, first_line, log
from reproduce.benchmark.scheduler import drain, finish_runs, new_scheduler_runner, scheduler_pass
from reproduce.benchmark.world import make_consumers, quiet_other_dags

MIXED_STATES = ("stock", "fixed producers, stock scheduler", "stock producers, fixed scheduler", "fixed")
MIXED_AFTER_SECONDS = (
    30.0  # a fixed scheduler's loops after a mixed state: its sweep's first round is at 10 s
)


def _use_state(variants: Variants, state: str):
    """
    Put ``state``'s code in place; returns the dataset manager its producers call.

    A stock scheduler beside fixed producers: the scheduler's module unpatched. Stock
    producers beside a fixed scheduler: everything fixed (a fixed scheduler process has
    the fixed manager too), and the producers call a subclass that carries the stock
    members, as a producer process without the fix runs them.
    """
    import importlib

    from airflow.datasets.manager import DatasetManager, dataset_manager

    from airflow_dataset_race_fix import runtime
    from airflow_dataset_race_fix.targets import members_of

    variants.use("stock" if state == "stock" else "fixed")
    if state == "fixed producers, stock scheduler":
        runtime.unpatch_module(importlib.import_module("airflow.jobs.scheduler_job_runner"))
    if state != "stock producers, fixed scheduler":
        return dataset_manager
    stock = type("StockDatasetManager", (DatasetManager,), {})
    for member in members_of("airflow.datasets.manager"):
        original = runtime._originals.get((member.module, member.owner, member.name))
        if original is not None and original is not runtime._MISSING:
            setattr(stock, member.name, original)
    return stock


def bench_mixed_upgrade(
    variants: Variants, rounds: int, notes: list[str], producers: int = 4, commits: int = 50
) -> None:
    """
    The mixed states of the upgrade procedure's shortcuts: fixed producers beside a stock
    scheduler and the reverse, against all stock and all fixed. Each state has its own DAGs (on ``a``, on
    ``b``, on ``a | b``); ``producers`` threads commit ``commits`` tasks each with outlets
    ``[a, b]`` or ``[b, a]`` (random order, no retries) while a scheduler thread loops. Then
    the state's scheduler drains the queue, and the invariant checker counts lost and doubled
    events; for a mixed state, a new fixed scheduler then drains again (the upgrade finished). Failed producer
    transactions and scheduler errors are counted.
    """
    import random
    import threading

    from airflow import settings
    from airflow.datasets import Dataset, DatasetAny

    from airflow_dataset_race_fix.diagnostics import invariant

    for round_no in range(rounds):
        for state in MIXED_STATES:
            tag = f"r{round_no}_{MIXED_STATES.index(state)}"
            a, b = Dataset(f"bench://mixed/{tag}/a"), Dataset(f"bench://mixed/{tag}/b")
            names = make_consumers(
                f"bench_mixed_{tag}", {"on_a": [a], "on_b": [b], "a_or_b": DatasetAny(a, b)}
            )
            quiet_other_dags(names)
            manager = _use_state(variants, state)
            since = datetime.now(timezone.utc) - timedelta(seconds=1)
            runner = new_scheduler_runner()
            failed: list[str] = []
            scheduler_errors: list[str] = []
            slowest = [0.0]

            def scheduler(stop: threading.Event) -> None:
                session = settings.Session.session_factory()
                while not stop.is_set():
                    finish_runs(names)
                    if error := scheduler_pass(runner, session):
                        scheduler_errors.append(error)
                session.close()

            def producer(seed: int) -> None:
                rng = random.Random(seed)
                for _ in range(commits):
                    outlets = [a, b] if rng.random() < 0.5 else [b, a]
                    session = settings.Session.session_factory()
                    started = time.perf_counter()
                    try:
                        for dataset in outlets:
                            manager.register_dataset_change(dataset=dataset, session=session)
                        session.commit()
                    except Exception as err:  # counted: producers here have no retries
                        session.rollback()
                        failed.append(first_line(err))
                    finally:
                        session.close()
                    slowest[0] = max(slowest[0], time.perf_counter() - started)
                    time.sleep(rng.uniform(0, 0.01))

            run_beside_a_scheduler(
                scheduler, [lambda seed=round_no * 100 + n: producer(seed) for n in range(producers)]
            )
            scheduler_errors += drain(runner, names)

            def judged() -> tuple[int, int]:
                with settings.Session() as session:
                    report = invariant.check(session, names, since=since)
                return report.total("lost"), report.total("doubled")

            outcome = "lost {}, doubled {}".format(*judged())
            if (
                state in MIXED_STATES[1:3]
            ):  # the upgrade finished: a fixed scheduler's loops until none is lost
                _use_state(
                    variants, "fixed"
                )  # (its sweep's first round one requeue interval after its start)
                fixed, began = new_scheduler_runner(), time.monotonic()
                drain(fixed, names)
                while judged()[0] and time.monotonic() - began < MIXED_AFTER_SECONDS:
                    time.sleep(0.2)
                    drain(fixed, names, max_passes=1)
                outcome += "; then a fixed scheduler: lost {}, doubled {}".format(*judged())
                outcome += f" after {time.monotonic() - began:.1f} s"
            line = (
                f"mixed upgrade, {state}, round {round_no + 1}: {producers * commits} producer transactions "
                f"(2 outlets), failed {len(failed)}, slowest {slowest[0]:.2f} s, scheduler errors "
                f"{len(scheduler_errors)}; {outcome}"
            )
            log(f"  {line}")
            if failed or scheduler_errors:
                log(f"    e.g. {(failed + scheduler_errors)[:3]}")
            notes.append(line)
    variants.use("stock")
