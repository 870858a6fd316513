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

The managed platforms' routes (no PYTHONPATH): ``airflow_local_settings.py`` in the plugins
folder (MWAA's and Cloud Composer 2's layout), and the plugin's opt-in
``AIRFLOW__DATASET_RACE_FIX__ENABLE_VIA_PLUGIN=True``, in each process type that registers
dataset events or creates dataset-triggered runs: the same behaviour checks show whether
the fix was in place before the process first used a target.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import AIRFLOW_VERSION, BACKEND
from matrix import MAIN_PYTHON, MAIN_RELEASE, ON_SQLITE_ONLY
from shim_children import (
    INFO_LINE,
    PYTHON,
    WARNING_MARK,
    airflow_shadow,
    assert_fixed_once,
    change_one_byte,
    child_env,
    count,
    fixed_targets,
    output,
    readme_local_settings,
    result,
    run_python,
    run_status,
    shim_env,
)

from reproduce.harness.database import DatabaseUnavailable, ScratchDatabase

pytestmark = ON_SQLITE_ONLY

AIRFLOW = os.path.join(os.path.dirname(PYTHON), "airflow")

# The managed platforms' routes (docs/activation.md), and the PYTHONPATH route.
PYTHONPATH_ROUTE = "PYTHONPATH"
LOCAL_SETTINGS_ROUTE = "airflow_local_settings"
PLUGIN_ROUTE = "plugin"
MANAGED_ROUTES = (LOCAL_SETTINGS_ROUTE, PLUGIN_ROUTE)
PLUGIN_OPT_IN = {"AIRFLOW__DATASET_RACE_FIX__ENABLE_VIA_PLUGIN": "True"}
# When each process type loads airflow_local_settings or its plugins is Airflow's doing, not
# the database's or the Python's: the routes' real-process tests run in the 3.11 SQLite env of
# each Airflow release, for CI time (about 40 s); the servers, 'tasks run', 'tasks test' and the
# quiet commands (about 55 s) only in the quick start's env (Airflow 2.10.4), like
# test_install.py's quick start. The whole module runs in the SQLite envs only (tests/matrix.py).
ROUTES_ENV = pytest.mark.skipif(
    sys.version_info[:2] != MAIN_PYTHON,
    reason="the managed platforms' routes in real Airflow processes: "
    "in the 3.11 SQLite envs only, for CI time",
)
ROUTES_SERVERS_ENV = pytest.mark.skipif(
    (sys.version_info[:2], AIRFLOW_VERSION) != (MAIN_PYTHON, MAIN_RELEASE),
    reason="webserver, triggerer, 'tasks run' and 'tasks test' per route: "
    "in the quick start's env only, for CI time",
)

DAGS = """
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
"""

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
        session.execute(
            delete(DatasetDagRunQueue).where(
                DatasetDagRunQueue.dataset_id == dataset_id, DatasetDagRunQueue.target_dag_id == dag_id
            )
        )
        session.add(DatasetDagRunQueue(dataset_id=dataset_id, target_dag_id=dag_id, created_at=created_at))

def state(uri, dag_id):
    with create_session() as session:
        dataset_id = _dataset_id(session, uri)
        created = session.scalar(
            select(DatasetDagRunQueue.created_at).where(
                DatasetDagRunQueue.dataset_id == dataset_id, DatasetDagRunQueue.target_dag_id == dag_id
            )
        )
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
        # The plugins folder of the airflow_local_settings route, as MWAA and Cloud Composer 2 sync it.
        self.route_plugins = os.path.join(home, "route-plugins")
        os.makedirs(self.route_plugins, exist_ok=True)
        with open(os.path.join(self.route_plugins, "airflow_local_settings.py"), "w") as f:
            f.write(readme_local_settings())

    def env(
        self,
        shim: bool,
        disabled: bool = False,
        strict: bool = False,
        site: str | None = None,
        log_level: str = "INFO",
        route: str | None = None,
    ) -> dict[str, str]:
        """``route``: None (``shim`` says PYTHONPATH or nothing), or one of MANAGED_ROUTES."""
        switches = {"AIRFLOW_DATASET_RACE_FIX_DISABLED": "1"} if disabled else {}
        if strict:
            switches["AIRFLOW_DATASET_RACE_FIX_STRICT"] = "1"
        airflow_env = dict(self.airflow_env)
        if route == LOCAL_SETTINGS_ROUTE:
            airflow_env["AIRFLOW__CORE__PLUGINS_FOLDER"] = self.route_plugins
        elif route == PLUGIN_ROUTE:
            airflow_env.update(PLUGIN_OPT_IN)
        if shim and route in (None, PYTHONPATH_ROUTE):
            return shim_env(*([site] if site else []), switches=switches, log_level=log_level, **airflow_env)
        return child_env([site] if site else [], switches=switches, log_level=log_level, **airflow_env)

    def airflow(
        self,
        *args: str,
        shim: bool = True,
        disabled: bool = False,
        strict: bool = False,
        site: str | None = None,
        succeed: bool = True,
        log_level: str = "INFO",
        route: str | None = None,
    ) -> subprocess.CompletedProcess:
        env = self.env(shim, disabled, strict, site, log_level, route)
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
        announced = fixed_targets(output(reserialize), level="DEBUG")
        assert announced and len(set(announced)) == len(announced), output(reserialize)[-3000:]
        assert (
            count(output(reserialize), INFO_LINE) == len(announced)
            and count(output(reserialize), "WARNING") == 0
        )
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
        assert_fixed_once(output(run), "airflow.datasets.manager")
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
        # the scheduler's log says that its own code is fixed, at INFO
        assert_fixed_once(output(run), "airflow.datasets.manager", "airflow.jobs.scheduler_job_runner")
        assert after["runs"] == before["runs"], "no run without an event (S5)"
        assert after["queue_created_at"] is None, "the queue row without events is dropped"
    else:
        assert count(output(run), INFO_LINE) == 0
        assert after["runs"] == before["runs"] + 1 and 0 in after["consumed"], (
            "stock: a run that consumes nothing"
        )


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
    assert (
        "no target module is patched in this process, because airflow.datasets.manager was refused"
        in warnings[0]
    )
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
    _assert_strict_mode_stops(
        world, changed_manager, command, "RefusedError: airflow-dataset-race-fix (strict)"
    )


def _assert_strict_mode_stops(
    world, changed_manager, command, refusal: str, route: str | None = None
) -> None:
    """The command fails on the refused manager, runs no task code and no scheduler loop."""
    key = "'adrf://shim-e2e/scheduler', 'adrf_shim_scheduler_consumer'"
    before = world.probe(f"queue_row({key}, {NOW}); state({key})")

    run = world.airflow(
        *command, site=changed_manager, strict=True, succeed=False, **({"route": route} if route else {})
    )

    text = output(run)
    assert run.returncode != 0, text[-3000:]
    assert refusal in text
    assert "DatasetManager._slow_path_queue_dagruns is not the Airflow" in text
    assert "ADRF TASK RAN" not in text and count(text, INFO_LINE) == 0
    assert world.probe(f"state({key})")["runs"] == before["runs"], "no scheduler loop ran"


# --- the managed platforms' routes: airflow_local_settings.py and the plugin's opt-in -----------
#
# Each test shows, by the same behaviour as above, that the route had the fix in place before
# the process first used a target: a task's first event moves the stale queue row forward, the
# scheduler's first loop creates no empty run.


@ROUTES_ENV
@pytest.mark.parametrize(
    "route,logical_date",
    [(LOCAL_SETTINGS_ROUTE, "2026-04-01T00:00:00+00:00"), (PLUGIN_ROUTE, "2026-04-02T00:00:00+00:00")],
)
def test_dags_test_on_a_managed_route_runs_the_fixed_producer(world, route, logical_date):
    key = "'adrf://shim-e2e/task', 'adrf_shim_task_consumer'"
    world.probe(f"queue_row({key}, {STALE}); state({key})")

    run = world.airflow("dags", "test", "adrf_shim_producer", logical_date, route=route)

    assert_fixed_once(output(run), "airflow.datasets.manager")
    assert world.probe(f"state({key})")["queue_created_at"] > "2026", (
        "the fixed producer moved the row forward"
    )


@ROUTES_ENV
@pytest.mark.parametrize("route", MANAGED_ROUTES)
def test_a_scheduler_on_a_managed_route_runs_the_fixed_scheduler(world, route):
    key = "'adrf://shim-e2e/scheduler', 'adrf_shim_scheduler_consumer'"
    before = world.probe(f"queue_row({key}, {NOW}); state({key})")

    run = world.airflow("scheduler", "--num-runs", "1", route=route)

    after = world.probe(f"state({key})")
    assert_fixed_once(output(run), "airflow.datasets.manager", "airflow.jobs.scheduler_job_runner")
    assert after["runs"] == before["runs"], "no run without an event (S5)"
    assert after["queue_created_at"] is None, "the queue row without events is dropped"


@ROUTES_ENV
@pytest.mark.parametrize(
    "route,command",
    [
        # The plugin route fails closed by SystemExit: from Job() in the scheduler, and inside
        # the task runner's own try (it fails the task before the task's code runs).
        # (airflow_local_settings starts the hooks before any target's import, which then fails
        # as with PYTHONPATH above: test_shim.py shows it in a child.)
        (PLUGIN_ROUTE, ("scheduler", "--num-runs", "1")),
        (PLUGIN_ROUTE, ("tasks", "test", "adrf_shim_marker", "mark", "2026-03-02")),
    ],
    ids=["plugin-scheduler", "plugin-tasks-test"],
)
def test_strict_mode_stops_the_airflow_command_on_a_managed_route(world, changed_manager, command, route):
    refusal = "airflow-dataset-race-fix (strict): airflow.datasets.manager refused"
    _assert_strict_mode_stops(world, changed_manager, command, refusal, route=route)


@ROUTES_SERVERS_ENV
def test_short_cli_commands_stay_quiet_on_the_managed_routes(world):
    # 'airflow plugins' loads the plugins: the plugin route itself prints nothing, and is listed.
    plugins = world.airflow("plugins", "--output", "json", route=PLUGIN_ROUTE)
    assert count(output(plugins), WARNING_MARK) == 0, output(plugins)[-3000:]
    listed = [line for line in plugins.stdout.splitlines() if line.startswith("[")]
    assert "airflow_dataset_race_fix" in [plugin["name"] for plugin in json.loads(listed[-1])]
    # 'dags list' imports the dataset manager: patched (the line at DEBUG), and quiet at INFO.
    debug = world.airflow("dags", "list", route=LOCAL_SETTINGS_ROUTE, log_level="DEBUG")
    assert "DEBUG - airflow-dataset-race-fix: fix in place" in output(debug), output(debug)[-3000:]
    quiet = world.airflow("dags", "list", route=LOCAL_SETTINGS_ROUTE)
    assert count(output(quiet), WARNING_MARK) == 0, output(quiet)[-3000:]


@ROUTES_SERVERS_ENV
@pytest.mark.parametrize("route", MANAGED_ROUTES)
def test_tasks_run_on_a_managed_route_runs_the_fixed_producer(world, route):
    """'airflow tasks run --local', the command the Local and Sequential executors run (the task
    itself in a process forked from it)."""
    key = "'adrf://shim-e2e/task', 'adrf_shim_task_consumer'"
    run_id = f"adrf_tasks_run_{route}"
    world.airflow(
        "dags",
        "trigger",
        "adrf_shim_producer",
        "--run-id",
        run_id,
        "--exec-date",
        {LOCAL_SETTINGS_ROUTE: "2026-06-01", PLUGIN_ROUTE: "2026-06-02"}[route],
        shim=False,
    )
    world.probe(f"queue_row({key}, {STALE}); state({key})")

    run = world.airflow("tasks", "run", "adrf_shim_producer", "emit", run_id, "--local", route=route)

    assert_fixed_once(output(run), "airflow.datasets.manager")
    assert world.probe(f"state({key})")["queue_created_at"] > "2026", (
        "the fixed producer moved the row forward"
    )


@ROUTES_ENV
@pytest.mark.parametrize("variant,date", [("fixed", "2026-07-01"), ("disabled", "2026-07-02")])
def test_a_producer_task_s_own_log_says_whether_its_code_is_fixed(world, variant, date):
    """The task runs in a process forked from 'tasks run --local' (as under the LocalExecutor): its
    log, the one an operator reads in the UI, says once whether its code is fixed, and if not, why."""
    run_id = f"adrf_task_log_{variant}"
    world.airflow(
        "dags", "trigger", "adrf_shim_producer", "--run-id", run_id, "--exec-date", date, shim=False
    )

    world.airflow(
        "tasks", "run", "adrf_shim_producer", "emit", run_id, "--local", disabled=variant == "disabled"
    )

    import glob

    (path,) = glob.glob(
        os.path.join(
            world.airflow_env["AIRFLOW_HOME"], "**", f"run_id={run_id}", "task_id=emit", "attempt=*.log"
        ),
        recursive=True,
    )
    with open(path) as f:
        task_log = f.read()
    if variant == "fixed":
        assert assert_fixed_once(task_log) == ["airflow.datasets.manager"]
    else:
        assert count(task_log, INFO_LINE) == 0
        assert (
            count(
                task_log,
                "INFO - airflow-dataset-race-fix: the fix is NOT in place in this process: disabled "
                "by AIRFLOW_DATASET_RACE_FIX_DISABLED",
            )
            == 1
        ), task_log[-3000:]


@ROUTES_SERVERS_ENV
@pytest.mark.parametrize("route,date", [(LOCAL_SETTINGS_ROUTE, "2026-05-01"), (PLUGIN_ROUTE, "2026-05-02")])
def test_tasks_test_on_a_managed_route_has_the_fix_before_the_task_runs(world, route, date):
    # 'tasks test' registers no dataset event (test mode): the fix is in place before the task runs.
    run = world.airflow("tasks", "test", "adrf_shim_marker", "mark", date, route=route)
    assert_fixed_once(run.stdout)
    assert run.stdout.index(INFO_LINE) < run.stdout.index("ADRF TASK RAN")


@contextlib.contextmanager
def _server(args: list[str], env: dict[str, str], log_path):
    """An Airflow server in a session of its own, stopped with everything it started."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [AIRFLOW, *args], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # gunicorn workers still shutting down
            proc.wait()


def _wait_for(predicate, what: str, log_path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} after {timeout} s:\n{log_path.read_text()[-3000:]}"
        time.sleep(0.5)


@ROUTES_SERVERS_ENV
@pytest.mark.parametrize("route", MANAGED_ROUTES)
def test_a_triggerer_on_a_managed_route_has_the_fix_before_its_loop(world, route, tmp_path):
    # The triggerer registers no dataset event on 2.10/2.11; all or nothing holds it to the rest.
    log_path = tmp_path / "triggerer.log"
    with _server(["triggerer", "--skip-serve-logs"], world.env(shim=False, route=route), log_path):
        _wait_for(lambda: "Starting the triggerer" in log_path.read_text(), "triggerer loop", log_path)
    text = log_path.read_text()
    assert_fixed_once(text)
    assert text.index(INFO_LINE) < text.index("Starting the triggerer")


@pytest.fixture(scope="module")
def api_user(world):
    world.airflow(
        "users",
        "create",
        "--username",
        "adrf",
        "--password",
        "adrf",
        "--role",
        "Admin",
        "--email",
        "adrf@example.invalid",
        "--firstname",
        "a",
        "--lastname",
        "b",
        shim=False,
    )
    return "adrf", "adrf"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@ROUTES_SERVERS_ENV
@pytest.mark.parametrize("route", MANAGED_ROUTES)
def test_the_rest_api_on_a_managed_route_runs_the_fixed_producer(world, api_user, route, tmp_path):
    """POST /api/v1/datasets/events on 'airflow webserver' (gunicorn, the app preloaded)."""
    key = "'adrf://shim-e2e/task', 'adrf_shim_task_consumer'"
    world.probe(f"queue_row({key}, {STALE}); state({key})")
    port = _free_port()
    env = world.env(shim=False, route=route)
    env.update(
        AIRFLOW__API__AUTH_BACKENDS="airflow.api.auth.backend.basic_auth", AIRFLOW__WEBSERVER__WORKERS="1"
    )
    log_path = tmp_path / "webserver.log"
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    with _server(["webserver", "--port", str(port)], env, log_path):
        _wait_for(healthy, "healthy webserver", log_path)
        request = urllib.request.Request(
            f"{base}/api/v1/datasets/events",
            data=json.dumps({"dataset_uri": "adrf://shim-e2e/task"}).encode(),
            headers={
                "Content-Type": "application/json",
                "Authorization": "Basic " + base64.b64encode(":".join(api_user).encode()).decode(),
            },
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.load(response)
            assert response.status == 200 and answer["dataset_uri"] == "adrf://shim-e2e/task"

    # The answer is the event as flushed, before the commit restamps it:
    # what docs/behaviour.md says (issue 50)
    from datetime import datetime, timezone

    from sqlalchemy import create_engine
    from sqlalchemy import text as sql

    engine = create_engine(world.airflow_env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    with engine.connect() as conn:
        stored = conn.execute(
            sql("SELECT timestamp FROM dataset_event WHERE id = :id"), {"id": answer["id"]}
        ).scalar()
    engine.dispose()
    stored = stored if isinstance(stored, datetime) else datetime.fromisoformat(stored)
    assert datetime.fromisoformat(answer["timestamp"]) < stored.replace(tzinfo=stored.tzinfo or timezone.utc)
    behaviour = (Path(__file__).resolve().parents[1] / "docs" / "behaviour.md").read_text()
    assert "`POST /api/v1/datasets/events` answers with the event as flushed" in behaviour

    text = log_path.read_text()
    assert count(text, INFO_LINE) >= 1 and not _our_warnings(text), text[-3000:]
    assert world.probe(f"state({key})")["queue_created_at"] > "2026", (
        "the fixed producer moved the row forward"
    )
