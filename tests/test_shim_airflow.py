"""
Real Airflow processes started with the shim on PYTHONPATH run the fixed code.

A scratch metadata database of our own (on ADRF_BACKEND) and a DAG folder with one
producer and two dataset-scheduled consumers. Each test runs the Airflow command twice:
with the shim, and with the shim on PYTHONPATH but disabled (stock Airflow), and shows
the difference by behaviour in the tables and by the shim's INFO line:

- task process (``airflow dags test``): a queue row that predates the new event gets a
  fresh ``created_at`` from the fixed producer; stock Airflow leaves it stale (S1);
- scheduler (``airflow scheduler --num-runs 1``): a queue row with no event behind it
  makes stock Airflow create a run that consumes nothing (S5); the fixed scheduler creates
  none and drops the row.

And with one changed byte in a targeted member (in a symlinked copy of Airflow put first
on PYTHONPATH): no target is patched in the process, and in strict mode the commands stop.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap

import pytest
from shim_children import (
    INFO_LINE,
    PYTHON,
    airflow_shadow,
    change_one_byte,
    child_env,
    count,
    output,
    result,
    run_python,
    run_status,
    shim_env,
)

from airflow_dataset_race_fix.harness.database import DatabaseUnavailable, ScratchDatabase

from conftest import BACKEND

AIRFLOW = os.path.join(os.path.dirname(PYTHON), "airflow")

DAGS = '''
import pendulum

from airflow import DAG
from airflow.datasets import Dataset
from airflow.operators.empty import EmptyOperator
from airflow.operators.python import PythonOperator

START = pendulum.datetime(2026, 1, 1, tz="UTC")
TASK_DATASET = Dataset("adrf://shim-e2e/task")
SCHEDULER_DATASET = Dataset("adrf://shim-e2e/scheduler")

with DAG("adrf_shim_producer", start_date=START, schedule=None, catchup=False):
    PythonOperator(task_id="emit", python_callable=lambda: None, outlets=[TASK_DATASET])

with DAG("adrf_shim_task_consumer", start_date=START, schedule=[TASK_DATASET], catchup=False):
    EmptyOperator(task_id="noop")

with DAG("adrf_shim_scheduler_consumer", start_date=START, schedule=[SCHEDULER_DATASET], catchup=False):
    EmptyOperator(task_id="noop")

with DAG("adrf_shim_marker", start_date=START, schedule=None, catchup=False):
    PythonOperator(task_id="mark", python_callable=lambda: print("ADRF TASK RAN"))
'''

# Child code run without the shim against the scratch database: read or seed the tables.
PROBE = """
import json
from datetime import datetime, timezone
from sqlalchemy import delete, func, select
from airflow.models.dagrun import DagRun
from airflow.models.dataset import DatasetDagRunQueue, DatasetModel
from airflow.utils.session import create_session

def _dataset_id(session, uri):
    return session.scalar(select(DatasetModel.id).where(DatasetModel.uri == uri))

def queue_row(uri, dag_id, created_at):
    with create_session() as session:
        dataset_id = _dataset_id(session, uri)
        session.execute(delete(DatasetDagRunQueue).where(DatasetDagRunQueue.dataset_id == dataset_id, DatasetDagRunQueue.target_dag_id == dag_id))
        session.add(DatasetDagRunQueue(dataset_id=dataset_id, target_dag_id=dag_id, created_at=created_at))

def state(uri, dag_id):
    with create_session() as session:
        dataset_id = _dataset_id(session, uri)
        created = session.scalar(select(DatasetDagRunQueue.created_at).where(DatasetDagRunQueue.dataset_id == dataset_id, DatasetDagRunQueue.target_dag_id == dag_id))
        runs = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id)).all()
        print("RESULT " + json.dumps(dict(
            queue_created_at=created.isoformat() if created else None,
            runs=len(runs),
            consumed=sorted(len(run.consumed_dataset_events) for run in runs),
        )))
"""

STALE = "datetime(2001, 1, 1, tzinfo=timezone.utc)"
NOW = "datetime.now(timezone.utc)"


class AirflowWorld:
    """The scratch database, AIRFLOW_HOME and environment the Airflow commands share."""

    def __init__(self, url: str, home: str) -> None:
        self.airflow_env = {
            "AIRFLOW_HOME": home,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url,
            "AIRFLOW__CORE__DAGS_FOLDER": os.path.join(home, "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__EXECUTOR": "SequentialExecutor",
            # The DAGs are serialized once by 'dags reserialize': no parsing in the scheduler.
            "AIRFLOW__SCHEDULER__STANDALONE_DAG_PROCESSOR": "True",
        }

    def env(
        self, shim: bool, disabled: bool = False, strict: bool = False, site: str | None = None, log_level: str = "INFO"
    ) -> dict[str, str]:
        switches = {"AIRFLOW_DATASET_RACE_FIX_DISABLED": "1"} if disabled else {}
        if strict:
            switches["AIRFLOW_DATASET_RACE_FIX_STRICT"] = "1"
        if shim:
            return shim_env(*([site] if site else []), switches=switches, log_level=log_level, **self.airflow_env)
        return child_env([site] if site else [], switches=switches, log_level=log_level, **self.airflow_env)

    def airflow(
        self, *args: str, shim: bool = True, disabled: bool = False, strict: bool = False, site: str | None = None,
        succeed: bool = True, log_level: str = "INFO",
    ) -> subprocess.CompletedProcess:
        env = self.env(shim, disabled, strict, site, log_level)
        proc = subprocess.run([AIRFLOW, *args], env=env, capture_output=True, text=True, timeout=300)
        if succeed:
            assert proc.returncode == 0, f"airflow {' '.join(args)} failed:\n{output(proc)[-4000:]}"
        return proc

    def probe(self, call: str) -> dict:
        return result(run_python(PROBE + "\n" + call + "\n", self.env(shim=False)))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    database = ScratchDatabase(BACKEND)
    try:
        database.create()
    except DatabaseUnavailable as err:
        pytest.skip(f"{BACKEND} server unavailable: {err}")
    home = str(tmp_path_factory.mktemp("airflow-home"))
    os.makedirs(os.path.join(home, "dags"))
    with open(os.path.join(home, "dags", "adrf_shim_dags.py"), "w") as f:
        f.write(textwrap.dedent(DAGS))
    world = AirflowWorld(database.url, home)
    try:
        # Short CLI commands with the shim: patched, and quiet (the line is DEBUG there).
        migrate = world.airflow("db", "migrate")
        assert count(output(migrate), "airflow-dataset-race-fix") == 0, output(migrate)[-3000:]
        reserialize = world.airflow("dags", "reserialize", log_level="DEBUG")
        assert count(output(reserialize), INFO_LINE) == 1 and count(output(reserialize), "WARNING") == 0
        yield world
    finally:
        database.drop()
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.parametrize(
    "variant,logical_date",
    [("fixed", "2026-02-01T00:00:00+00:00"), ("stock", "2026-02-02T00:00:00+00:00")],
)
def test_a_task_process_with_the_shim_runs_the_fixed_producer(world, variant, logical_date):
    key = "'adrf://shim-e2e/task', 'adrf_shim_task_consumer'"
    world.probe(f"queue_row({key}, {STALE}); state({key})")

    run = world.airflow("dags", "test", "adrf_shim_producer", logical_date, disabled=variant == "stock")

    created_at = world.probe(f"state({key})")["queue_created_at"]
    if variant == "fixed":
        assert count(output(run), INFO_LINE) == 1, output(run)[-3000:]
        assert created_at > "2026", "the fixed producer moves the queue row's created_at forward"
    else:
        assert count(output(run), INFO_LINE) == 0
        assert created_at.startswith("2001-01-01"), "stock Airflow keeps the stale queue row (S1)"


@pytest.mark.parametrize("variant", ["fixed", "stock"])
def test_a_scheduler_with_the_shim_runs_the_fixed_scheduler(world, variant):
    key = "'adrf://shim-e2e/scheduler', 'adrf_shim_scheduler_consumer'"
    before = world.probe(f"queue_row({key}, {NOW}); state({key})")
    assert before["queue_created_at"] is not None

    run = world.airflow("scheduler", "--num-runs", "1", disabled=variant == "stock")

    after = world.probe(f"state({key})")
    if variant == "fixed":
        assert count(output(run), INFO_LINE) == 1, output(run)[-3000:]
        assert after["runs"] == before["runs"], "no run without an event (S5)"
        assert after["queue_created_at"] is None, "the queue row without events is dropped"
    else:
        assert count(output(run), INFO_LINE) == 0
        assert after["runs"] == before["runs"] + 1 and 0 in after["consumed"], "stock: a run that consumes nothing"


@pytest.fixture(scope="module")
def changed_manager(tmp_path_factory):
    """Airflow with one byte changed in DatasetManager._slow_path_queue_dagruns."""
    site = airflow_shadow(str(tmp_path_factory.mktemp("changed-airflow")))
    change_one_byte(site, "airflow/datasets/manager.py", "_slow_path_queue_dagruns")
    return site


def _our_warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if "WARNING" in line and "airflow-dataset-race-fix" in line]


def test_one_changed_byte_in_the_manager_leaves_the_scheduler_stock_too(world, changed_manager):
    key = "'adrf://shim-e2e/scheduler', 'adrf_shim_scheduler_consumer'"
    before = world.probe(f"queue_row({key}, {NOW}); state({key})")

    run = world.airflow("scheduler", "--num-runs", "1", site=changed_manager)

    after = world.probe(f"state({key})")
    assert count(output(run), INFO_LINE) == 0, output(run)[-3000:]
    warnings = _our_warnings(output(run))
    assert len(warnings) == 1, warnings
    assert "no target module is patched in this process, because airflow.datasets.manager was refused" in warnings[0]
    assert "DatasetManager._slow_path_queue_dagruns is not the Airflow" in warnings[0]
    # The stock scheduler's S5: a run that consumes nothing.
    assert after["runs"] == before["runs"] + 1 and 0 in after["consumed"]

    status = run_status(world.env(shim=True, site=changed_manager))
    assert status.returncode == 1, output(status)
    assert status.stdout.count(": refused") == 2 and "Fix active: NO" in status.stdout
    assert "all or nothing and airflow.datasets.manager was refused" in status.stdout


@pytest.mark.parametrize(
    "command",
    [("tasks", "test", "adrf_shim_marker", "mark", "2026-03-01"), ("scheduler", "--num-runs", "1")],
    ids=["tasks-test", "scheduler"],
)
def test_strict_mode_stops_the_airflow_command_when_a_target_is_refused(world, changed_manager, command):
    key = "'adrf://shim-e2e/scheduler', 'adrf_shim_scheduler_consumer'"
    before = world.probe(f"queue_row({key}, {NOW}); state({key})")

    run = world.airflow(*command, site=changed_manager, strict=True, succeed=False)

    text = output(run)
    assert run.returncode != 0, text[-3000:]
    assert "RefusedError: airflow-dataset-race-fix (strict)" in text
    assert "DatasetManager._slow_path_queue_dagruns is not the Airflow" in text
    assert "ADRF TASK RAN" not in text and count(text, INFO_LINE) == 0
    assert world.probe(f"state({key})")["runs"] == before["runs"], "no scheduler loop ran"
