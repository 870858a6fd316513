"""Producers as the cases run them: a transaction on a session of its own, threads beside a scheduler."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from reproduce.benchmark.runner import Variants, first_line


def producer_transaction(
    dataset, before_commit: Callable[[Any], None] | None = None, visible_after: list[float] | None = None
) -> tuple[float, str | None]:
    """
    One producer transaction on a session of its own: register an event on ``dataset`` (a list:
    on each, in its order, as a task with several outlets), commit.

    Returns its duration and, when it failed (and was rolled back), the error's first line.
    ``before_commit(session)`` is registered once the event is registered, so it runs after
    the fix's own ``before_commit`` hook (queue upsert and stamp), right before the COMMIT.
    ``visible_after`` gets, once committed (untimed), how long after its timestamp the
    event was visible: the database's clock read after the COMMIT returned, minus the
    timestamp (an upper bound). This is what the fixed scheduler's commit_latency_seconds
    must cover (stamp to COMMIT); stock's is flush to COMMIT, what its look-back window covered.
    """
    from airflow import settings
    from airflow.datasets.manager import dataset_manager
    from sqlalchemy import event

    session = settings.Session.session_factory()
    try:
        started = time.perf_counter()
        for outlet in dataset if isinstance(dataset, list) else [dataset]:
            dataset_event = dataset_manager.register_dataset_change(dataset=outlet, session=session)
        if before_commit is not None:
            event.listen(session, "before_commit", before_commit, once=True)
        session.commit()
        elapsed = time.perf_counter() - started
        if visible_after is not None and dataset_event is not None:
            from airflow_dataset_race_fix.fix.datasets.manager import DatasetManager as FixedManager

            # the clock the fix dates events on, read whichever variant is active
            visible_after.append(
                (FixedManager._database_now(session) - dataset_event.timestamp).total_seconds()
            )
        return elapsed, None
    except Exception as err:  # counted by the caller, not hidden
        session.rollback()
        return time.perf_counter() - started, first_line(err)
    finally:
        session.close()


def run_beside_a_scheduler(scheduler: Callable[[Any], None], producers: list[Callable[[], None]]) -> None:
    """Run ``producers`` to their end, each on a thread, while ``scheduler(stop)`` loops on another."""
    import threading

    stop = threading.Event()
    busy = threading.Thread(target=scheduler, args=(stop,))
    busy.start()
    threads = [threading.Thread(target=producer) for producer in producers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    busy.join()


def commit_new_events(variants: Variants, datasets: list[Any]) -> None:
    """
    A new event on each of ``datasets``, in one transaction of a stock producer, committed once: every
    sample of either variant then creates the runs for them in a transaction it rolls back.
    """
    from airflow import settings
    from airflow.datasets.manager import dataset_manager

    variants.use("stock")
    with settings.Session() as session:
        for dataset in datasets:
            dataset_manager.register_dataset_change(dataset=dataset, session=session)
        session.commit()
