"""
``producer``: ``DatasetManager.register_dataset_change`` plus commit, for a dataset with 1, 10 and 50
consuming DAGs, with the queue empty (first event after the scheduler drained it) and with the queue
rows already there (a burst).
"""

from __future__ import annotations

import time
from typing import Any

from reproduce.benchmark.figures import ms_line, paired_row
from reproduce.benchmark.runner import Variants, alternate, log
from reproduce.benchmark.world import id_of, make_consumers


def bench_producer(variants: Variants, fanouts: tuple[int, ...], samples: int) -> list[dict[str, Any]]:
    from airflow import settings
    from airflow.datasets import Dataset
    from airflow.datasets.manager import dataset_manager
    from airflow.models.dataset import DatasetDagRunQueue
    from sqlalchemy import delete

    rows = []
    for fanout in fanouts:
        dataset = Dataset(f"bench://producer/{fanout}")
        make_consumers(f"bench_producer_{fanout}", {f"c{i:02d}": [dataset] for i in range(fanout)})
        dataset_id = id_of(dataset)
        for queue_state in ("empty queue", "rows queued"):

            def measure(variant: str) -> float:
                session = settings.Session.session_factory()
                try:
                    if queue_state == "empty queue":
                        session.execute(
                            delete(DatasetDagRunQueue).where(DatasetDagRunQueue.dataset_id == dataset_id)
                        )
                        session.commit()
                    started = time.perf_counter()
                    dataset_manager.register_dataset_change(dataset=dataset, session=session)
                    session.commit()
                    return time.perf_counter() - started
                finally:
                    session.close()

            times = alternate(variants, samples, measure)
            rows.append(paired_row(f"producer, {fanout} DAG(s), {queue_state}", times))
            log(f"  {rows[-1]['case']}: {ms_line(rows[-1])}")
    return rows
