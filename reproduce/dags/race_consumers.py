"""
Consumers for ``reproduce --e2e``: one DAG on ``a``, one on ``a & b``, one on ``a | b``.

Their single task is an EmptyOperator, which the scheduler marks done without an
executor slot, so consumer runs finish quickly and the count of their consumed events
is what the invariant checker reads. ``max_active_runs=1``, as many deployments set on
dataset consumers: while a run is active, new events wait in a queue row (issue #56750).
"""

from __future__ import annotations

from datetime import datetime

from airflow import DAG
from airflow.datasets import Dataset
from airflow.operators.empty import EmptyOperator

A = Dataset("race-e2e://datasets/a")
B = Dataset("race-e2e://datasets/b")

for dag_id, schedule in (
    ("race_consumer_a", [A]),
    ("race_consumer_a_and_b", A & B),
    ("race_consumer_a_or_b", A | B),
):
    with DAG(
        dag_id,
        schedule=schedule,
        start_date=datetime(2024, 1, 1),
        catchup=False,
        max_active_runs=1,
        tags=["airflow-dataset-race-fix"],
    ) as dag:
        EmptyOperator(task_id="consume")
    globals()[dag_id] = dag
