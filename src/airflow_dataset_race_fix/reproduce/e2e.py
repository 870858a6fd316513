"""
``reproduce --e2e``: a real ``airflow scheduler`` process runs the DAG files of
``reproduce/dags`` and the invariant checker counts what it did.

Runs inside a child interpreter that the parent already pointed at a scratch database
(``child._prepare``). This driver starts the scheduler (LocalExecutor on PostgreSQL and
MySQL/MariaDB; SequentialExecutor on SQLite, the only executor Airflow allows there),
with the fix on PYTHONPATH for the fixed variant (``shim``), triggers the producers with
seeded gaps, waits for the drain, stops the scheduler and counts from the tables.
"""

from __future__ import annotations

import glob
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from airflow_dataset_race_fix.reproduce import shim

PRODUCER_A, PRODUCER_B = "race_producer_a", "race_producer_b"
PRODUCERS = (PRODUCER_A, PRODUCER_B)
CONSUMERS = ("race_consumer_a", "race_consumer_a_and_b", "race_consumer_a_or_b")
MAPPED_B = 5
POLL_SECONDS = 2.0
QUIET_POLLS = 4  # unchanged polls after the producers finished before we call it drained
PARSE_TIMEOUT = 180.0
EXECUTORS = {"local": "LocalExecutor", "sequential": "SequentialExecutor"}


def default_executor(backend: str) -> str:
    """LocalExecutor where Airflow allows it; SQLite allows only single-threaded executors."""
    return "sequential" if backend == "sqlite" else "local"


def default_triggers(backend: str) -> int:
    """Runs of the main producer. SQLite's SequentialExecutor starts one interpreter per task
    (3-5 s each on a small machine), so it gets fewer. The race shows there all the same: the
    tasks queued in one loop run back to back before the next loop, and while a consumer run
    is active (max_active_runs=1) their events join a queue row whose created_at never moves."""
    return 2 if backend == "sqlite" else 4


def dags_dir() -> str:
    """reproduce/dags of the source checkout this package runs from (ADRF_E2E_DAGS overrides)."""
    path = os.environ.get("ADRF_E2E_DAGS") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "reproduce", "dags"
    )
    path = os.path.normpath(path)
    if not glob.glob(os.path.join(path, "race_*.py")):
        raise FileNotFoundError(
            f"the e2e DAG files are not at {path}; run from a source checkout or set ADRF_E2E_DAGS"
        )
    return path


def airflow_env(spec: dict[str, Any]) -> dict[str, str]:
    """Settings of the scheduler and its task processes (on top of the child's own)."""
    executor = EXECUTORS[spec.get("executor") or default_executor(spec["backend"])]
    return {
        "AIRFLOW__CORE__EXECUTOR": executor,
        "AIRFLOW__CORE__PARALLELISM": str(spec["parallelism"]),
        "AIRFLOW__CORE__DEFAULT_TASK_RETRIES": "0",  # a failed producer must show as failed
        # Airflow's rendered-fields cleanup (a DELETE per task across all map indexes) deadlocks
        # among 30 mapped tasks on MariaDB; it is housekeeping outside the dataset code.
        "AIRFLOW__CORE__MAX_NUM_RENDERED_TI_FIELDS_PER_TASK": "0",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "AIRFLOW__SCHEDULER__DAG_DIR_LIST_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "60",
        "AIRFLOW__SCHEDULER__PARSING_PROCESSES": "1",
        "AIRFLOW__WEBSERVER__SECRET_KEY": "adrf-e2e",
        # The scheduler serves task logs; a port of our own so that runs side by side do not collide.
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(_free_port()),
        "ADRF_E2E_MAPPED": str(spec["mapped"]),
        "ADRF_E2E_MAPPED_B": str(MAPPED_B),
        "ADRF_E2E_SEED": str(spec["seed"]),
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(spec: dict[str, Any], progress: Callable[[str], None]) -> dict[str, Any]:
    spec = {**spec, "triggers": spec.get("triggers") or default_triggers(spec["backend"])}
    home = os.environ["AIRFLOW_HOME"]
    for path in glob.glob(os.path.join(dags_dir(), "race_*.py")):
        shutil.copy(path, os.path.join(home, "dags"))
    env = shim.child_env({**os.environ, **airflow_env(spec)}, spec["variant"])
    # The executors start `airflow tasks run ...`: this interpreter's `airflow` must be first on PATH.
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    log_path = os.path.join(home, "scheduler.log")
    started = time.monotonic()
    scheduler = Scheduler(env, log_path, progress)
    notes: list[str] = []
    try:
        _wait_for_dags(scheduler, progress)
        triggers = _trigger(spec, progress)
        drained = _wait_for_drain(scheduler, spec["timeout"], started, progress)
        if not drained:
            notes.append(f"not drained within {spec['timeout']:.0f} s")
    finally:
        log_end = os.path.getsize(log_path)  # what the scheduler logs while stopping is no finding
        scheduler.stop()
    seconds = round(time.monotonic() - started, 1)
    counts = count(spec, triggers)
    notes += counts.pop("notes") + _log_findings(home, log_path, log_end)
    if spec.get("keep_logs"):
        shutil.copytree(os.path.join(home, "logs"), spec["keep_logs"], dirs_exist_ok=True)
        shutil.copy(log_path, spec["keep_logs"])
    counts["producer_failures_by_cause"] = failure_causes(os.path.join(home, "logs"))
    problems = judge(spec["variant"], counts, drained, scheduler.crashes, notes)
    progress(f"done in {seconds} s: {', '.join(f'{k}={v}' for k, v in problems.items()) or 'no violation'}")
    return {
        "seed": spec["seed"], "drained": drained, "seconds": seconds, "problems": problems, "notes": notes,
        "scheduler_crashes": len(scheduler.crashes), **counts,
    }


def judge(variant: str, counts: dict[str, Any], drained: bool, crashes: list[str], notes: list[str]) -> dict[str, int]:
    """What went wrong in a run: invariant violations, failed producers, crashes, no drain."""
    problems = dict(counts["violations"])
    causes = counts["producer_failures_by_cause"]
    # Airflow's own task/scheduler deadlock on dag_run (MySQL/MariaDB) fails a producer
    # outside the dataset code, stock or fixed alike: reported, not held against the fix.
    not_ours = causes.get(OTHER_CAUSE, 0)
    if not_ours:
        notes.append(f"{not_ours} producer task(s) failed outside the dataset code: {causes['sample_other']}")
    if counts["producer_tis_failed"] > not_ours:
        problems["producer_tis_failed"] = counts["producer_tis_failed"] - not_ours
    if not drained:
        problems["not_drained"] = 1
    if crashes:
        problems["scheduler_crashes"] = len(crashes)
        notes += [f"scheduler crashed (restarted): {crash}" for crash in crashes[:2]]
    if variant == "fixed" and counts["fix_active_count"] < counts["producer_tis_succeeded"]:
        problems["fix_not_active"] = counts["producer_tis_succeeded"] - counts["fix_active_count"]
    return problems


def _session():
    from airflow.utils.session import create_session

    return create_session()


def _wait_for_dags(scheduler: Scheduler, progress: Callable[[str], None]) -> None:
    from sqlalchemy import func, select

    from airflow.models.serialized_dag import SerializedDagModel

    progress("scheduler started; waiting for it to parse the DAG files")
    deadline = time.monotonic() + PARSE_TIMEOUT
    while time.monotonic() < deadline:
        scheduler.check()
        with _session() as session:
            parsed = session.scalar(
                select(func.count()).where(SerializedDagModel.dag_id.in_(PRODUCERS + CONSUMERS))
            )
        if parsed == len(PRODUCERS + CONSUMERS):
            return
        time.sleep(1)
    raise TimeoutError(f"the scheduler did not parse the DAG files within {PARSE_TIMEOUT:.0f} s")


def _trigger(spec: dict[str, Any], progress: Callable[[str], None]) -> dict[str, int]:
    """Trigger the producers with seeded gaps: a ``triggers`` times, b every other time."""
    from airflow.api.common.trigger_dag import trigger_dag

    rng = random.Random(spec["seed"])
    triggered: Counter[str] = Counter()
    for index in range(spec["triggers"]):
        dag_ids = [PRODUCER_A] + ([PRODUCER_B] if index % 2 == 0 else [])
        for dag_id in dag_ids:
            trigger_dag(dag_id, run_id=f"race_{index}", replace_microseconds=False)
            triggered[dag_id] += 1
        progress(f"triggered {' and '.join(dag_ids)} ({index + 1}/{spec['triggers']})")
        if index + 1 < spec["triggers"]:
            time.sleep(rng.uniform(1.0, 6.0))
    return dict(triggered)


def _producer_task_states(session) -> dict:
    """Producer task instances by state."""
    from sqlalchemy import func, select

    from airflow.models.taskinstance import TaskInstance

    return dict(
        session.execute(
            select(TaskInstance.state, func.count())
            .where(TaskInstance.dag_id.in_(PRODUCERS))
            .group_by(TaskInstance.state)
        ).all()
    )


def _snapshot() -> tuple:
    from sqlalchemy import func, select

    from airflow.models.dagrun import DagRun
    from airflow.models.dataset import DatasetDagRunQueue, DatasetEvent

    with _session() as session:
        runs = tuple(
            session.execute(
                select(DagRun.dag_id, DagRun.state, func.count()).group_by(DagRun.dag_id, DagRun.state).order_by(
                    DagRun.dag_id, DagRun.state
                )
            ).all()
        )
        tis = _producer_task_states(session)
        events = session.scalar(select(func.count()).select_from(DatasetEvent))
        queued = session.scalar(select(func.count()).select_from(DatasetDagRunQueue))
    return runs, tuple(sorted((str(k), v) for k, v in tis.items())), events, queued


def _wait_for_drain(scheduler: Scheduler, timeout: float, started: float, progress) -> bool:
    """Until the producer runs are over and nothing changes for QUIET_POLLS polls in a row."""
    deadline = time.monotonic() + timeout
    previous, quiet, last_report = None, 0, 0.0
    while time.monotonic() < deadline:
        scheduler.check()
        state = _snapshot()
        runs, tis, events, queued = state
        active = {(dag_id, s) for dag_id, s, _ in runs if s in ("queued", "running")}
        producers_active = any(dag_id in PRODUCERS for dag_id, _ in active)
        quiet = quiet + 1 if state == previous and not active else 0
        previous = state
        now = time.monotonic()
        if now - last_report >= 10:
            done = sum(n for s, n in tis if s in ("success", "failed", "upstream_failed"))
            total = sum(n for _, n in tis)
            consumer_runs = sum(n for dag_id, _, n in runs if dag_id in CONSUMERS)
            progress(
                f"{now - started:5.0f} s: producer tasks {done}/{total} done, events {events}, "
                f"consumer runs {consumer_runs}, queue rows {queued}"
                + ("" if producers_active else ", producers finished: draining")
            )
            last_report = now
        if quiet >= QUIET_POLLS:
            return True
        time.sleep(POLL_SECONDS)
    return False


class Scheduler:
    """``airflow scheduler`` in its own process group, restarted if it dies (as a supervisor
    such as systemd would): stock MariaDB schedulers die of deadlocks under this load."""

    MAX_RESTARTS = 3

    def __init__(self, env: dict[str, str], log_path: str, progress: Callable[[str], None]) -> None:
        self.env, self.log_path, self.progress = env, log_path, progress
        self.crashes: list[str] = []
        self.process = self._start()

    def _start(self) -> subprocess.Popen:
        with open(self.log_path, "a") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "airflow", "scheduler"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped with its children
            )

    def check(self) -> None:
        """Restart the scheduler if it exited; give up after MAX_RESTARTS."""
        if self.process.poll() is None:
            return
        crash = f"exit {self.process.returncode}: {_last_error(self.log_path)}"
        self.crashes.append(crash)
        self.stop()  # its task processes and DAG processor, if any survived it
        if len(self.crashes) > self.MAX_RESTARTS:
            raise RuntimeError(f"the scheduler died {len(self.crashes)} times; last: {crash}")
        self.progress(f"the scheduler died ({crash}); restarting it")
        self.process = self._start()

    def stop(self) -> None:
        """SIGTERM to the scheduler's process group, SIGKILL if it lingers; then any of its
        descendants that left the group (the DAG processor manager starts its own session)."""
        import psutil

        try:
            descendants = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.Error:  # already gone: its group may still hold task processes
            descendants = []
        for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        _, alive = psutil.wait_procs(descendants, timeout=10)
        for process in alive:
            try:
                process.kill()
            except psutil.Error:
                pass


def count(spec: dict[str, Any], triggers: dict[str, int]) -> dict[str, Any]:
    """What the tables say: invariant counts of the consumers, producer task outcomes, fix state."""
    from sqlalchemy import func, select

    from airflow.models.dagrun import DagRun
    from airflow.models.dataset import DatasetEvent
    from airflow.models.xcom import XCom

    from airflow_dataset_race_fix import invariant

    with _session() as session:
        report = invariant.check(session, CONSUMERS)
        ti_states = Counter(_producer_task_states(session))
        events = session.scalar(select(func.count()).select_from(DatasetEvent))
        consumer_runs = session.scalar(select(func.count()).where(DagRun.dag_id.in_(CONSUMERS)))
        states = [
            _decoded(value)
            for value in session.scalars(
                select(XCom.value).where(XCom.dag_id.in_(PRODUCERS), XCom.key == "return_value")
            )
        ]
    fix_active = sum(1 for s in states if isinstance(s, dict) and all(s.values()))
    expected = triggers.get(PRODUCER_A, 0) * spec["mapped"] + triggers.get(PRODUCER_B, 0) * MAPPED_B
    failed = ti_states.get("failed", 0) + ti_states.get("upstream_failed", 0)
    notes = []
    unfinished = expected - ti_states.get("success", 0) - failed
    if unfinished:
        notes.append(f"{unfinished} producer task(s) neither succeeded nor failed: {dict(ti_states)}")
    return {
        "triggers": triggers,
        "expected_events": expected,
        "events": events,
        "producer_tis_succeeded": ti_states.get("success", 0),
        "producer_tis_failed": failed,
        "fix_active_count": fix_active,
        "fix_active": f"{fix_active}/{len(states)}",
        "consumer_runs": consumer_runs,
        "totals": report.totals(),
        "violations": report.violations(),
        "by_dag": {d.dag_id: d.violations() for d in report.dags},
        "notes": notes,
    }


def _last_error(log_path: str) -> str:
    """The last exception line of the scheduler's log."""
    with open(log_path, errors="replace") as handle:
        lines = [line.strip() for line in handle if line[:1].isalpha() and ("Error" in line or "Exception" in line)]
    return lines[-1][:300] if lines else "no error in its log"


DATASET_SQL = ("dataset_event", "dataset_dag_run_queue", "savepoint")
OTHER_CAUSE = "outside the dataset code"


def failure_causes(logs: str) -> dict[str, Any]:
    """Failed producer tasks by where the failing statement was: dataset tables or elsewhere."""
    causes: Counter[str] = Counter()
    sample = ""
    for path in glob.glob(os.path.join(logs, "dag_id=race_producer_*", "**", "*.log"), recursive=True):
        with open(path, errors="replace") as handle:
            text = handle.read()
        if "Failed to execute job" not in text:
            continue
        failing = text[text.index("Failed to execute job"):]
        statement = next((line for line in failing.splitlines() if line.startswith("[SQL: ")), "")
        if statement and not any(name in statement.lower() for name in DATASET_SQL):
            causes[OTHER_CAUSE] += 1
            sample = sample or f"{failing.splitlines()[0][-120:]} {statement[:100]}"
        else:
            causes["dataset code or unknown"] += 1
    return {**causes, "sample_other": sample} if causes else {}


def _decoded(value: Any) -> Any:
    """An XCom value as stored by the default backend (JSON; bytes or text depending on the dialect)."""
    if isinstance(value, bytes):
        value = value.decode()
    return json.loads(value) if isinstance(value, str) else value


def _log_findings(home: str, scheduler_log: str, log_end: int, limit: int = 2) -> list[str]:
    """A few distinct database errors of failed producer tasks and of the scheduler."""
    findings: Counter[str] = Counter()
    for path in glob.glob(os.path.join(home, "logs", "dag_id=race_producer_*", "**", "*.log"), recursive=True):
        with open(path, errors="replace") as handle:
            for line in handle:
                if "Error" in line and ("sqlalchemy.exc" in line or "OperationalError" in line or "IntegrityError" in line):
                    findings["task: " + line.split("] ", 1)[-1].strip()[:160]] += 1
                    break
    with open(scheduler_log, errors="replace") as handle:
        for line in handle.read(log_end).splitlines():
            if line.startswith("sqlalchemy.exc"):
                findings["scheduler: " + line.strip()[:160]] += 1
    return [f"{text} (x{n})" for text, n in findings.most_common(limit)]
