"""
Which processes of a deployment ran the fix (issue 48, "one place to see it"), on the session's
database: simulated hosts (``[core] hostname_callable`` per process), each process a real
``airflow`` command. host-a runs the fix (scheduler, triggerer, dag-processor, and a producer
task twice), host-b has no airflow-dataset-race-fix at all (its entry points hidden: no plugin,
no shim; a scheduler and a producer), host-c has the package with the fix switched off.
``deployment`` names host-b and host-c, says why, and exits 1; a host writes one producer mark
an hour and verdict, and a task forked from a LocalExecutor scheduler writes no scheduler mark.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from conftest import AIRFLOW_VERSION, BACKEND
from matrix import MAIN_PYTHON, MAIN_RELEASE, SOURCE_MODE
from shim_children import PYTHON, child_env, output, shim_env

# Real processes of the main release through the shim; the SQL it reads, on each backend.
pytestmark = pytest.mark.skipif(
    SOURCE_MODE or sys.version_info[:2] != MAIN_PYTHON or AIRFLOW_VERSION != MAIN_RELEASE,
    reason="airflow2104-{sqlite,postgres,mysql} run it",
)

AIRFLOW = os.path.join(os.path.dirname(PYTHON), "airflow")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the session's database settings module

DAGS = """
import pendulum
from airflow import DAG
from airflow.datasets import Dataset
from airflow.operators.empty import EmptyOperator
from airflow.operators.python import PythonOperator

DATASET = Dataset("adrf://deployment/d")
with DAG("adrf_deployment_producer", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), schedule=None):
    PythonOperator(task_id="emit", python_callable=lambda: None, outlets=[DATASET, Dataset("adrf://deployment/e")])
with DAG("adrf_deployment_consumer", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), schedule=[DATASET]):
    EmptyOperator(task_id="noop")
"""

HOST_MODULE = "import os\n\ndef name():\n    return os.environ['ADRF_HOST']\n"

# A host without this package: Airflow sees no airflow.plugins entry point of ours, and no shim runs.
WITHOUT_PACKAGE = """
import sys
import airflow.utils.entry_points as entry_points
grouped = entry_points.entry_points_with_dist
entry_points.entry_points_with_dist = lambda group: iter(()) if group == "airflow.plugins" else grouped(group)
import airflow.plugins_manager as plugins_manager
plugins_manager.entry_points_with_dist = entry_points.entry_points_with_dist
from airflow.__main__ import main
sys.argv = ["airflow", *sys.argv[1:]]
main()
"""


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    from airflow.models.dag import DagModel
    from airflow.models.dagbag import DagBag
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType

    root = tmp_path_factory.mktemp("deployment")
    (root / "dags").mkdir()
    (root / "dags" / "adrf_deployment.py").write_text(textwrap.dedent(DAGS))
    (root / "adrf_host.py").write_text(HOST_MODULE)
    dagbag = DagBag(str(root / "dags"), include_examples=False)
    dagbag.sync_to_db()
    producer = dagbag.dags["adrf_deployment_producer"]
    import pendulum

    with create_session() as session:
        for day, host in enumerate(("host-a", "host-b", "host-c", "host-a-again"), start=1):
            producer.create_dagrun(
                run_id=f"adrf_deployment_{host}",
                state=DagRunState.RUNNING,
                execution_date=pendulum.datetime(2026, 2, day, tz="UTC"),
                run_type=DagRunType.MANUAL,
                session=session,
            )
        SerializedDagModel.write_dag(producer, session=session)
    DagModel.get_dagmodel(producer.dag_id).set_is_paused(True)  # the schedulers start none of its tasks

    def command_and_env(host: str, kind: str, *args: str) -> tuple[list[str], dict[str, str]]:
        extra = {
            "ADRF_HOST": host,
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "adrf_host.name",
            "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
            "AIRFLOW__CORE__EXECUTOR": "SequentialExecutor",
            "AIRFLOW__SCHEDULER__STANDALONE_DAG_PROCESSOR": "True",
        }
        if kind == "without-package":
            return [PYTHON, "-c", WITHOUT_PACKAGE, *args], child_env([str(root), REPO], **extra)
        switches = {"AIRFLOW_DATASET_RACE_FIX_DISABLED": "1"} if kind == "off" else {}
        return [AIRFLOW, *args], shim_env(str(root), REPO, switches=switches, **extra)

    def airflow(host: str, kind: str, *args: str) -> subprocess.CompletedProcess:
        command, env = command_and_env(host, kind, *args)
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{host}: {' '.join(args)} failed:\n{output(proc)[-4000:]}"
        return proc

    airflow("host-a", "fixed", "scheduler", "--num-runs", "1")
    airflow("host-b", "without-package", "scheduler", "--num-runs", "1")
    if BACKEND != "sqlite":  # Airflow refuses a standalone dag-processor on SQLite
        airflow("host-a", "fixed", "dag-processor", "--num-runs", "1")
    _run_triggerer_until_its_job_heartbeats(*command_and_env("host-a", "fixed", "triggerer"))
    runs = (("host-a", "fixed"), ("host-b", "without-package"), ("host-c", "off"), ("host-a-again", "fixed"))
    for run, kind in runs:
        host = run.removesuffix("-again")
        airflow(
            host,
            kind,
            "tasks",
            "run",
            "adrf_deployment_producer",
            "emit",
            f"adrf_deployment_{run}",
            "--local",
        )
    return _deployment("--json", "--hours", "1")


def _run_triggerer_until_its_job_heartbeats(command: list[str], env: dict[str, str]) -> None:
    """A real ``airflow triggerer``, stopped by SIGTERM once its job row is there (it has no --num-runs)."""
    from airflow.jobs.job import Job
    from airflow.utils.session import create_session
    from sqlalchemy import select

    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            with create_session() as session:
                if session.scalar(
                    select(Job.id).where(Job.job_type == "TriggererJob", Job.hostname == "host-a")
                ):
                    break
            time.sleep(1)
        assert proc.poll() is None, f"the triggerer ended early:\n{proc.stdout.read()[-4000:]}"
    finally:
        proc.terminate()
        proc.wait(120)


def _ours(rows: list[dict]) -> dict[str, dict]:
    return {row["host"]: row for row in rows if row["host"] in ("host-a", "host-b", "host-c")}


def _deployment(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "airflow_dataset_race_fix", "deployment", *args],
        env=child_env([REPO]),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_deployment_names_the_hosts_that_ran_without_the_fix(deployment):
    assert deployment.returncode == 1, output(deployment)[-3000:]
    found = json.loads(deployment.stdout)
    assert found["schema"] == "airflow-dataset-race-fix/deployment/1"
    # Each component once per process start, the triggerer and the dag-processor
    # from their jobs as the schedulers
    ours = [
        (row["host"], row["component"]) for row in found["components"] if row["host"] in ("host-a", "host-b")
    ]
    processes = ["scheduler", "triggerer", *(["dag-processor"] if BACKEND != "sqlite" else [])]
    assert sorted(ours) == sorted([*(("host-a", name) for name in processes), ("host-b", "scheduler")]), ours
    components = {(row["host"], row["component"]): row for row in found["components"]}
    for name in processes:
        row = components["host-a", name]
        assert (row["fixed"], row["why"]) == (True, "patched by the shim") and row["job_id"], row
        assert row["stopped"] is not None, row  # each ended: --num-runs 1, SIGTERM
    stock = components["host-b", "scheduler"]
    assert stock["fixed"] is False and stock["why"].startswith("no mark") and stock["stopped"] is not None
    producers = _ours(found["producers"])
    assert {
        host: (row["fixed"], row["events"], row["task_instances"]) for host, row in producers.items()
    } == {"host-a": (True, 4, 2), "host-b": (False, 2, 1), "host-c": (False, 2, 1)}
    assert producers["host-b"]["why"].startswith("no mark")
    assert producers["host-c"]["why"] == "disabled by AIRFLOW_DATASET_RACE_FIX_DISABLED"
    assert (
        producers["host-a"]["dag_id"] == "adrf_deployment_producer"
        and producers["host-a"]["task_id"] == "emit"
    )
    # docs/deployment-json.md: every time in ISO 8601, UTC with its offset
    times = [
        found["since"],
        *(
            row[key]
            for row in found["components"] + found["producers"]
            for key in ("first", "last", "stopped")
            if row.get(key)
        ),
    ]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00", t) for t in times), times


def test_the_documented_json_keys_are_the_printed_keys(deployment):
    """docs/deployment-json.md: each ``<!-- keys: PATH -->`` table lists exactly the keys printed there."""
    text = (Path(REPO) / "docs" / "deployment-json.md").read_text()
    found = json.loads(deployment.stdout)
    documented = {
        path: {key for row in table.splitlines()[2:] for key in re.findall(r"`([^`]+)`", row.split("|")[1])}
        for path, table in re.findall(r"<!-- keys: (.*?) -->\n((?:\|.*\n)+)", text)
    }
    printed = {
        ".": set(found),
        **{f"{name}[]": {key for row in found[name] for key in row} for name in ("components", "producers")},
    }
    assert documented == printed


def test_a_host_writes_one_producer_mark_an_hour_and_verdict(deployment):
    """host-a ran two producer tasks, each in fresh processes: one mark, naming the task that wrote it;
    host-c's (off) says why; host-b (no package) wrote none. No task wrote a component mark."""
    from airflow.models.log import Log
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from airflow_dataset_race_fix.evidence import MARK_EVENT

    with create_session() as session:
        marks = [
            (run_id, json.loads(extra))
            for run_id, extra in session.execute(select(Log.run_id, Log.extra).where(Log.event == MARK_EVENT))
        ]
    ours = [(run_id, mark) for run_id, mark in marks if mark["host"] in ("host-a", "host-b", "host-c")]
    producers = sorted((m["host"], m["fixed"], run_id) for run_id, m in ours if m["component"] == "task")
    assert producers == [
        ("host-a", True, "adrf_deployment_host-a"),
        ("host-c", False, "adrf_deployment_host-c"),
    ]
    assert [m for _, m in ours if m["component"] == "task" and m["host"] == "host-c"][0]["why"] == (
        "disabled by AIRFLOW_DATASET_RACE_FIX_DISABLED"
    )
    processes = ["scheduler", "triggerer", *(["dag-processor"] if BACKEND != "sqlite" else [])]
    assert sorted(m["component"] for _, m in ours if m["component"] != "task") == sorted(processes)


def test_a_component_started_before_the_period_and_alive_in_it_is_fixed(deployment):
    """host-a's scheduler as if it had started (and marked) two days ago and heartbeat now: FIXED and running
    with --hours 1. A 'scheduler' mark that matches no job, as earlier releases wrote from a task forked from
    a LocalExecutor scheduler, is no component."""
    from airflow.jobs.job import Job
    from airflow.models.log import Log
    from airflow.utils import timezone
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from airflow_dataset_race_fix.evidence import MARK_EVENT

    back = timedelta(days=2)
    with create_session() as session:
        job = session.scalars(
            select(Job).where(Job.job_type == "SchedulerJob", Job.hostname == "host-a")
        ).one()
        marks = session.scalars(select(Log).where(Log.event == MARK_EVENT, Log.dag_id.is_(None))).all()
        mark = next(
            m
            for m in marks
            if json.loads(m.extra)["host"] == "host-a" and json.loads(m.extra)["component"] == "scheduler"
        )
        extra = json.loads(mark.extra)
        extra["started"] = (datetime.fromisoformat(extra["started"]) - back).isoformat()
        mark.extra, mark.dttm = json.dumps(extra, sort_keys=True), mark.dttm - back
        job.start_date, job.state, job.end_date = job.start_date - back, "running", None
        job.latest_heartbeat = timezone.utcnow()
        session.add(Log(MARK_EVENT, extra=json.dumps({**extra, "started": timezone.utcnow().isoformat()})))
        job_id, started = job.id, job.start_date
    found = json.loads(_deployment("--json", "--hours", "1").stdout)
    schedulers = [
        row for row in found["components"] if row["host"] == "host-a" and row["component"] == "scheduler"
    ]
    assert [(row["job_id"], row["fixed"], row["stopped"]) for row in schedulers] == [(job_id, True, None)], (
        schedulers
    )
    text = _deployment("--hours", "1")
    assert (
        f"FIXED     scheduler (job {job_id}) on host-a, started {started:%Y-%m-%d %H:%M:%S}, seen "
        in text.stdout
    )
    assert re.search(r"NOT FIXED scheduler \(job \d+\) on host-b, started .*, stopped \d{4}-", text.stdout), (
        text.stdout
    )
    print(text.stdout)  # with -s: what an operator reads


@pytest.mark.parametrize("hours", ["0", "-1", "inf", "nan", "1e9", "abc"])
def test_bad_hours_exit_2_with_one_line(hours):
    proc = _deployment("--hours", hours)
    message = f"hours {hours!r}: expected a number above 0 and at most 8784 (366 days)"
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2,
        "",
        f"airflow-dataset-race-fix deployment: error: {message}\n",
    )


def test_the_hours_rule():
    from airflow_dataset_race_fix.diagnostics.deployment import period_hours

    assert [period_hours(text) for text in ("0.005", "24", " 8784 ", "1e-3")] == [0.005, 24.0, 8784.0, 0.001]
    for text in ("0", "-0.5", "8784.01", "inf", "-inf", "nan", "1e9", "1e400", "abc", "", "24h"):
        with pytest.raises(
            ValueError, match=r"^hours .*: expected a number above 0 and at most 8784 \(366 days\)$"
        ):
            period_hours(text)


LOCAL_DAG = """
import pendulum
from airflow import DAG
from airflow.datasets import Dataset
from airflow.operators.empty import EmptyOperator

with DAG("adrf_deployment_local", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), schedule=None):
    EmptyOperator(task_id="emit", outlets=[Dataset("adrf://deployment/local")])
    for index in range(3):
        EmptyOperator(task_id=f"plain_{index}")
"""


@pytest.mark.skipif(BACKEND == "sqlite", reason="Airflow runs no LocalExecutor on SQLite")
def test_tasks_forked_from_a_local_executor_scheduler_write_no_scheduler_mark(tmp_path, deployment):
    """Four tasks run in processes forked from 'airflow scheduler' (LocalExecutor), their command line
    the scheduler's: one scheduler mark for the one scheduler start, one producer mark, no other."""
    import pendulum
    from airflow.models.dag import DagModel
    from airflow.models.dagbag import DagBag
    from airflow.models.log import Log
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType
    from sqlalchemy import select

    from airflow_dataset_race_fix.evidence import MARK_EVENT

    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "adrf_deployment_local.py").write_text(textwrap.dedent(LOCAL_DAG))
    (tmp_path / "adrf_host.py").write_text(HOST_MODULE)
    dagbag = DagBag(str(tmp_path / "dags"), include_examples=False)
    dagbag.sync_to_db()
    dag = dagbag.dags["adrf_deployment_local"]
    with create_session() as session:
        dag.create_dagrun(
            run_id="adrf_local",
            state=DagRunState.RUNNING,
            run_type=DagRunType.MANUAL,
            execution_date=pendulum.datetime(2026, 3, 1, tz="UTC"),
            session=session,
        )
        SerializedDagModel.write_dag(dag, session=session)
    DagModel.get_dagmodel(dag.dag_id).set_is_paused(False)
    DagModel.get_dagmodel("adrf_deployment_consumer").set_is_paused(True)  # the other test's: not ours to run
    env = shim_env(
        str(tmp_path),
        REPO,
        ADRF_HOST="host-l",
        AIRFLOW__CORE__HOSTNAME_CALLABLE="adrf_host.name",
        AIRFLOW__CORE__DAGS_FOLDER=str(tmp_path / "dags"),
        AIRFLOW__CORE__EXECUTOR="LocalExecutor",
        AIRFLOW__CORE__PARALLELISM="4",
        AIRFLOW__SCHEDULER__STANDALONE_DAG_PROCESSOR="True",
    )
    proc = subprocess.run(
        [AIRFLOW, "scheduler", "--num-runs", "3"], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, output(proc)[-4000:]
    with create_session() as session:
        states = dict(
            session.execute(
                select(TaskInstance.task_id, TaskInstance.state).where(TaskInstance.dag_id == dag.dag_id)
            ).all()
        )
        marks = [json.loads(x) for x in session.scalars(select(Log.extra).where(Log.event == MARK_EVENT))]
    tasks = ("emit", "plain_0", "plain_1", "plain_2")
    assert states == {task_id: "success" for task_id in tasks}, output(proc)[-4000:]
    assert sorted(m["component"] for m in marks if m["host"] == "host-l") == ["scheduler", "task"]
