"""
``reproduce --e2e``: a real ``airflow scheduler`` process runs the DAG files of
``reproduce/dags`` and the invariant checker counts what it did.

Runs inside a child interpreter that the parent already pointed at a scratch database
(``child._prepare``). This driver starts the scheduler (LocalExecutor on PostgreSQL and
MySQL/MariaDB; SequentialExecutor on SQLite, the only executor Airflow allows there),
with the fix on PYTHONPATH for the fixed variant (``shim``), triggers the producers with
seeded gaps, waits for the drain, stops the scheduler and counts from the tables.
``e2e_celery`` runs the same steps (``drive``) with several schedulers and Celery workers.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from reproduce import shim

PRODUCER_A, PRODUCER_B, PRODUCER_AB = "race_producer_a", "race_producer_b", "race_producer_ab"
PRODUCERS = (PRODUCER_A, PRODUCER_B)
CONSUMERS = ("race_consumer_a", "race_consumer_a_and_b", "race_consumer_a_or_b")
MAPPED_B = 5
DAG_FILES = ("race_producers.py", "race_consumers.py")
POLL_SECONDS = 2.0
QUIET_POLLS = 4  # unchanged polls after the producers finished before we call it drained
PARSE_TIMEOUT = 180.0
EXECUTORS = {"local": "LocalExecutor", "sequential": "SequentialExecutor", "celery": "CeleryExecutor"}


@dataclass(frozen=True)
class Layout:
    """The producer DAGs of a run: per DAG, its mapped tasks as (instances, outlets per
    instance); ``multi`` adds ``race_producer_ab`` (outlets [a, b] and [b, a]), triggered
    with every run of ``a``."""

    mapped: int
    multi: int = 0

    @property
    def producers(self) -> tuple[str, ...]:
        return PRODUCERS + ((PRODUCER_AB,) if self.multi else ())

    def tasks(self, dag_id: str) -> list[tuple[int, int]]:
        return {
            PRODUCER_A: [(self.mapped, 1)],
            PRODUCER_B: [(MAPPED_B, 1)],
            PRODUCER_AB: [(self.multi, 2), (self.multi, 2)],
        }[dag_id]

    def tis_per_run(self, dag_id: str) -> int:
        return sum(instances for instances, _ in self.tasks(dag_id))

    def events_per_run(self, dag_id: str) -> int:
        return sum(instances * outlets for instances, outlets in self.tasks(dag_id))

    def outlets(self, task_id: str) -> int:
        return 2 if task_id in ("emit_ab", "emit_ba") else 1

    def triggered_at(self, index: int) -> list[str]:
        """``a`` every time (with ``ab`` when multi), ``b`` every other time."""
        return [PRODUCER_A] + ([PRODUCER_AB] if self.multi else []) + ([PRODUCER_B] if index % 2 == 0 else [])


def layout(spec: dict[str, Any]) -> Layout:
    return Layout(mapped=spec["mapped"], multi=spec.get("mapped_multi") or 0)


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
    """reproduce/dags next to this module (ADRF_E2E_DAGS overrides)."""
    path = os.environ.get("ADRF_E2E_DAGS") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "dags")
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
        "ADRF_E2E_MAPPED_MULTI": str(spec.get("mapped_multi") or 0),
    }


def install_dags(home: str) -> None:
    """Copy the DAG files of reproduce/dags into the Airflow home's DAG folder."""
    for name in DAG_FILES:
        shutil.copy(os.path.join(dags_dir(), name), os.path.join(home, "dags"))


def process_env(spec: dict[str, Any], extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of every Airflow process of the run: the child's, the run's settings, the
    variant's shim switch, and this interpreter's ``airflow`` first on PATH (executors start
    ``airflow tasks run ...``)."""
    env = shim.child_env({**os.environ, **airflow_env(spec), **(extra or {})}, spec["variant"])
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(spec: dict[str, Any], progress: Callable[[str], None]) -> dict[str, Any]:
    spec = {**spec, "triggers": spec.get("triggers") or default_triggers(spec["backend"])}
    home = os.environ["AIRFLOW_HOME"]
    install_dags(home)
    env = process_env(spec)
    started = time.monotonic()
    scheduler = Scheduler(env, os.path.join(home, "scheduler.log"), progress)
    return drive(spec, layout(spec), [scheduler], started, progress)


def drive(
    spec: dict[str, Any],
    lay: Layout,
    processes: Sequence[Supervised],
    started: float,
    progress: Callable[[str], None],
    on_poll: Callable[[bool], None] | None = None,
    extra_notes: Callable[[], list[str]] | None = None,
) -> dict[str, Any]:
    """Wait for the parse, trigger, wait for the drain, stop ``processes`` (always), count and judge.
    ``on_poll(producers_active)`` runs between polls from the first trigger on (chaos injection)."""
    home = os.environ["AIRFLOW_HOME"]
    notes: list[str] = []
    log_ends: dict[str, int] = {}
    try:
        _wait_for_dags(processes, lay.producers + CONSUMERS, progress)
        triggers = _trigger(spec, lay, progress, lambda seconds: _pause(processes, seconds, on_poll))
        drained = _wait_for_drain(processes, spec["timeout"], started, progress, lay, on_poll)
        if not drained:
            notes.append(f"not drained within {spec['timeout']:.0f} s")
    finally:
        # what the processes log while stopping is no finding
        log_ends = {p.log_path: os.path.getsize(p.log_path) for p in processes if os.path.exists(p.log_path)}
        stop_all(processes)
    seconds = round(time.monotonic() - started, 1)
    crashes = [crash for p in processes for crash in p.crashes]
    counts = count(spec, triggers, lay)
    notes += counts.pop("notes") + (extra_notes() if extra_notes else [])
    notes += _log_findings(home, log_ends)
    if spec.get("keep_logs"):
        shutil.copytree(os.path.join(home, "logs"), spec["keep_logs"], dirs_exist_ok=True)
        for log_path in log_ends:
            shutil.copy(log_path, spec["keep_logs"])
    counts["producer_failures_by_cause"] = failure_causes(os.path.join(home, "logs"))
    problems = judge(spec["variant"], counts, drained, crashes, notes)
    progress(f"done in {seconds} s: {', '.join(f'{k}={v}' for k, v in problems.items()) or 'no violation'}")
    return {
        "seed": spec["seed"],
        "drained": drained,
        "seconds": seconds,
        "problems": problems,
        "notes": notes,
        "scheduler_crashes": len(crashes),
        **counts,
    }


def stop_all(processes: Sequence[Supervised]) -> None:
    """Stop every process, even when stopping one of them fails."""
    errors = []
    for process in processes:
        try:
            process.stop()
        except Exception as err:  # keep stopping the others
            errors.append(f"{process.name}: {err}")
    if errors:
        raise RuntimeError("could not stop " + "; ".join(errors))


def _pause(processes: Sequence[Supervised], seconds: float, on_poll: Callable[[bool], None] | None) -> None:
    """Sleep ``seconds`` while supervising the processes and injecting due faults."""
    deadline = time.monotonic() + seconds
    while True:
        for process in processes:
            process.check()
        if on_poll:
            on_poll(True)
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(0.5, left))


def judge(
    variant: str, counts: dict[str, Any], drained: bool, crashes: list[str], notes: list[str]
) -> dict[str, int]:
    """What went wrong in a run: invariant violations, failed producers, crashes, no drain."""
    problems = dict(counts["violations"])
    causes = counts["producer_failures_by_cause"]
    # Airflow's own task/scheduler deadlock on dag_run (MySQL/MariaDB) fails a producer
    # outside the dataset code, stock or fixed alike: reported, not held against the fix.
    # (counted per failed try: with retries, a try that failed may be followed by one that succeeded)
    not_ours = min(causes.get(OTHER_CAUSE, 0), counts["producer_tis_failed"])
    if not_ours:
        notes.append(f"{not_ours} producer task(s) failed outside the dataset code: {causes['sample_other']}")
    if counts["producer_tis_failed"] > not_ours:
        problems["producer_tis_failed"] = counts["producer_tis_failed"] - not_ours
    if counts.get("events_not_atomic"):
        problems["events_not_atomic"] = counts["events_not_atomic"]
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


def _wait_for_dags(
    processes: Sequence[Supervised], dag_ids: Sequence[str], progress: Callable[[str], None]
) -> None:
    from airflow.models.dag import DagModel
    from airflow.models.serialized_dag import SerializedDagModel
    from sqlalchemy import func, select

    progress("scheduler started; waiting for it to parse the DAG files")
    deadline = time.monotonic() + PARSE_TIMEOUT
    while time.monotonic() < deadline:
        for process in processes:
            process.check()
        with _session() as session:
            parsed = session.scalar(select(func.count()).where(SerializedDagModel.dag_id.in_(dag_ids)))
            # trigger_dag needs the DagModel row too (written apart from the serialized DAG)
            known = session.scalar(
                select(func.count()).where(DagModel.dag_id.in_(dag_ids), DagModel.is_active)
            )
        if parsed == known == len(dag_ids):
            return
        time.sleep(1)
    raise TimeoutError(f"the scheduler did not parse the DAG files within {PARSE_TIMEOUT:.0f} s")


def _trigger(
    spec: dict[str, Any],
    lay: Layout,
    progress: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, int]:
    """Trigger the producers with seeded gaps (``Layout.triggered_at``)."""
    from airflow.api.common.trigger_dag import trigger_dag

    rng = random.Random(spec["seed"])
    triggered: Counter[str] = Counter()
    for index in range(spec["triggers"]):
        dag_ids = lay.triggered_at(index)
        for dag_id in dag_ids:
            trigger_dag(dag_id, run_id=f"race_{index}", replace_microseconds=False)
            triggered[dag_id] += 1
        progress(f"triggered {' and '.join(dag_ids)} ({index + 1}/{spec['triggers']})")
        if index + 1 < spec["triggers"]:
            sleep(rng.uniform(1.0, 6.0))
    return dict(triggered)


def _producer_task_states(session, producers: Sequence[str] = PRODUCERS) -> dict:
    """Producer task instances by state."""
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy import func, select

    return dict(
        session.execute(
            select(TaskInstance.state, func.count())
            .where(TaskInstance.dag_id.in_(producers))
            .group_by(TaskInstance.state)
        ).all()
    )


def _snapshot(producers: Sequence[str]) -> tuple:
    from airflow.models.dagrun import DagRun
    from airflow.models.dataset import DatasetDagRunQueue, DatasetEvent
    from sqlalchemy import func, select

    with _session() as session:
        runs = tuple(
            session.execute(
                select(DagRun.dag_id, DagRun.state, func.count())
                .group_by(DagRun.dag_id, DagRun.state)
                .order_by(DagRun.dag_id, DagRun.state)
            ).all()
        )
        tis = _producer_task_states(session, producers)
        events = session.scalar(select(func.count()).select_from(DatasetEvent))
        queued = session.scalar(select(func.count()).select_from(DatasetDagRunQueue))
    return runs, tuple(sorted((str(k), v) for k, v in tis.items())), events, queued


def _wait_for_drain(
    processes: Sequence[Supervised],
    timeout: float,
    started: float,
    progress,
    lay: Layout,
    on_poll: Callable[[bool], None] | None = None,
) -> bool:
    """Until the producer runs are over and nothing changes for QUIET_POLLS polls in a row.
    A poll that cannot reach the database (a restarting server) is skipped."""
    from sqlalchemy.exc import OperationalError

    deadline = time.monotonic() + timeout
    previous, quiet, last_report = None, 0, 0.0
    while time.monotonic() < deadline:
        for process in processes:
            process.check()
        try:
            state = _snapshot(lay.producers)
        except OperationalError as err:
            progress(f"poll failed, database unreachable: {str(err.orig).strip().splitlines()[0][:120]}")
            previous, quiet = None, 0
            time.sleep(POLL_SECONDS)
            continue
        runs, tis, events, queued = state
        active = {(dag_id, s) for dag_id, s, _ in runs if s in ("queued", "running")}
        producers_active = any(dag_id in lay.producers for dag_id, _ in active)
        if on_poll:
            on_poll(producers_active)
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


class Supervised:
    """An Airflow process in its own process group, restarted if it dies (as a supervisor
    such as systemd would): stock MariaDB schedulers die of deadlocks under this load."""

    MAX_RESTARTS = 3

    def __init__(
        self,
        name: str,
        args: list[str],
        env: dict[str, str],
        log_path: str,
        progress: Callable[[str], None],
        max_restarts: int | None = None,
    ) -> None:
        self.name, self.args, self.env, self.log_path, self.progress = name, args, env, log_path, progress
        self.max_restarts = self.MAX_RESTARTS if max_restarts is None else max_restarts
        self.crashes: list[str] = []
        self.down = False  # killed on purpose (chaos): not a crash, restarted by restart()
        self.process = self._start()

    def _start(self) -> subprocess.Popen:
        with open(self.log_path, "a") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "airflow", *self.args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped with its children
            )

    def check(self) -> None:
        """Restart the process if it exited; give up after ``max_restarts``."""
        if self.down or self.process.poll() is None:
            return
        crash = f"{self.name} exit {self.process.returncode}: {_last_error(self.log_path)}"
        self.crashes.append(crash)
        self.stop()  # its task processes and DAG processor, if any survived it
        if len(self.crashes) > self.max_restarts:
            raise RuntimeError(f"{self.name} died {len(self.crashes)} times; last: {crash}")
        self.progress(f"{self.name} died ({crash}); restarting it")
        self.process = self._start()

    def kill(self) -> int:
        """SIGKILL the process, its group and every descendant at once (a crash of its host or
        container); returns how many processes were killed. ``restart`` starts it again."""
        import psutil

        self.down = True
        try:
            victims = [
                psutil.Process(self.process.pid),
                *psutil.Process(self.process.pid).children(recursive=True),
            ]
        except psutil.Error:
            victims = []
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for victim in victims:
            try:
                victim.kill()
            except psutil.Error:
                pass
        self.process.wait(30)
        psutil.wait_procs(victims, timeout=10)
        return len(victims)

    def restart(self) -> None:
        self.process = self._start()
        self.down = False

    def stop(self, term_wait: float = 60) -> None:
        """SIGTERM to the process group, SIGKILL if it lingers; then any of its descendants
        that left the group (the DAG processor manager starts its own session)."""
        import psutil

        try:
            descendants = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.Error:  # already gone: its group may still hold task processes
            descendants = []
        for sig, wait in ((signal.SIGTERM, term_wait), (signal.SIGKILL, 10)):
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


class Scheduler(Supervised):
    """``airflow scheduler``."""

    def __init__(
        self,
        env: dict[str, str],
        log_path: str,
        progress: Callable[[str], None],
        name: str = "the scheduler",
        max_restarts: int | None = None,
    ) -> None:
        super().__init__(name, ["scheduler"], env, log_path, progress, max_restarts)


def count(spec: dict[str, Any], triggers: dict[str, int], lay: Layout | None = None) -> dict[str, Any]:
    """What the tables say: invariant counts of the consumers, producer task outcomes (with
    retries: try_number > 1), events against successful producers, fix state."""
    from airflow.models.dagrun import DagRun
    from airflow.models.dataset import DatasetEvent
    from airflow.models.xcom import XCom
    from sqlalchemy import func, select

    from airflow_dataset_race_fix.diagnostics import invariant

    lay = lay or layout(spec)
    with _session() as session:
        report = invariant.check(session, CONSUMERS)
        ti_states = Counter(_producer_task_states(session, lay.producers))
        events = session.scalar(select(func.count()).select_from(DatasetEvent))
        consumer_runs = session.scalar(select(func.count()).where(DagRun.dag_id.in_(CONSUMERS)))
        states = [
            _decoded(value)
            for value in session.scalars(
                select(XCom.value).where(XCom.dag_id.in_(lay.producers), XCom.key == "return_value")
            )
        ]
        tries = _producer_tries(session, lay)
    fix_active = sum(1 for s in states if isinstance(s, dict) and all(s.values()))
    expected = sum(n * lay.events_per_run(dag_id) for dag_id, n in triggers.items())
    failed = ti_states.get("failed", 0) + ti_states.get("upstream_failed", 0)
    # Atomic with the producer: one event per outlet of each successful task instance, no more.
    events_of_successes = tries.pop("events_of_successes")
    notes = []
    expected_tis = sum(n * lay.tis_per_run(dag_id) for dag_id, n in triggers.items())
    unfinished = expected_tis - ti_states.get("success", 0) - failed
    if unfinished:
        notes.append(f"{unfinished} producer task(s) neither succeeded nor failed: {dict(ti_states)}")
    return {
        "triggers": triggers,
        "expected_events": expected,
        "events": events,
        "producer_tis_succeeded": ti_states.get("success", 0),
        "producer_tis_failed": failed,
        **tries,
        "events_not_atomic": abs(events - events_of_successes),
        "fix_active_count": fix_active,
        "fix_active": f"{fix_active}/{len(states)}",
        "consumer_runs": consumer_runs,
        "totals": report.totals(),
        "violations": report.violations(),
        "by_dag": {d.dag_id: d.violations() for d in report.dags},
        "notes": notes,
    }


def _producer_tries(session, lay: Layout) -> dict[str, Any]:
    """Producer task instances that needed a retry (try_number > 1) or failed for good, each
    with its tries (TaskInstanceHistory keeps the state of every earlier try)."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskinstancehistory import TaskInstanceHistory
    from sqlalchemy import select

    def key(row) -> str:
        return f"{row.dag_id}/{row.task_id}[{row.map_index}] {row.run_id}"

    history: dict[str, list[str]] = {}
    for row in session.execute(
        select(
            TaskInstanceHistory.dag_id,
            TaskInstanceHistory.task_id,
            TaskInstanceHistory.map_index,
            TaskInstanceHistory.run_id,
            TaskInstanceHistory.try_number,
            TaskInstanceHistory.state,
        )
        .where(TaskInstanceHistory.dag_id.in_(lay.producers))
        .order_by(TaskInstanceHistory.try_number)
    ):
        history.setdefault(key(row), []).append(f"try {row.try_number}: {row.state}")
    retried, failed, events_of_successes = [], [], 0
    for row in session.execute(
        select(
            TaskInstance.dag_id,
            TaskInstance.task_id,
            TaskInstance.map_index,
            TaskInstance.run_id,
            TaskInstance.try_number,
            TaskInstance.state,
        ).where(TaskInstance.dag_id.in_(lay.producers))
    ):
        if row.state == "success":
            events_of_successes += lay.outlets(row.task_id)
        tries = [*history.get(key(row), []), f"try {row.try_number}: {row.state}"]
        entry = f"{key(row)}: {', '.join(tries)}"
        if row.try_number > 1:
            retried.append(entry)
        if row.state in ("failed", "upstream_failed"):
            failed.append(entry)
    return {
        "producer_tis_retried": len(retried),
        "producer_tis_retried_list": sorted(retried),
        "producer_tis_failed_list": sorted(failed),
        "events_of_successes": events_of_successes,
    }


def _last_error(log_path: str) -> str:
    """The last exception line of the scheduler's log."""
    with open(log_path, errors="replace") as handle:
        lines = [
            line.strip() for line in handle if line[:1].isalpha() and ("Error" in line or "Exception" in line)
        ]
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
        failing = text[text.index("Failed to execute job") :]
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


def _log_findings(home: str, log_ends: dict[str, int], limit: int = 2) -> list[str]:
    """A few distinct database errors of failed producer tasks and of the schedulers/workers
    (their logs up to ``log_ends``: what they log while being stopped is no finding)."""
    findings: Counter[str] = Counter()
    for path in glob.glob(
        os.path.join(home, "logs", "dag_id=race_producer_*", "**", "*.log"), recursive=True
    ):
        with open(path, errors="replace") as handle:
            for line in handle:
                if "Error" in line and (
                    "sqlalchemy.exc" in line or "OperationalError" in line or "IntegrityError" in line
                ):
                    findings["task: " + line.split("] ", 1)[-1].strip()[:160]] += 1
                    break
    for log_path, log_end in log_ends.items():
        name = os.path.splitext(os.path.basename(log_path))[0]
        with open(log_path, errors="replace") as handle:
            for line in handle.read(log_end).splitlines():
                if line.startswith("sqlalchemy.exc"):
                    findings[f"{name}: " + line.strip()[:160]] += 1
    return [f"{text} (x{n})" for text, n in findings.most_common(limit)]
