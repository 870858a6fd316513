"""
``reproduce --e2e --executor celery``: Airflow's CeleryExecutor with a real Redis broker and
result backend, several ``airflow scheduler`` and ``airflow celery worker`` processes, and
optional faults (``--chaos``) injected while the producers run.

Runs inside the child interpreter of one variant (``child._prepare`` pointed Airflow at a
scratch database). Every process gets the variant's environment (``e2e.process_env``): for
the fixed variant the shim is first on PYTHONPATH of the schedulers AND the workers (the
task processes are forks of the workers and inherit it). The rest (parse, trigger, drain,
count, judge) is ``e2e.drive``.

Redis: the run claims a database index of its own on the server (a claim key set with NX
in an empty database, 1 to 15) and empties only that database at the end (FLUSHDB, never
FLUSHALL).

Topology (defaults): 2 schedulers on PostgreSQL, 1 on MySQL/MariaDB (Airflow supports HA
schedulers only where row locks work: PostgreSQL and MySQL 8; MariaDB lacks them), 2
workers with 4 slots each. Producers: ``race_producer_a`` (30 mapped tasks, outlet a),
``race_producer_b`` (5, outlet b) and ``race_producer_ab`` (8 tasks with outlets [a, b] and
8 with [b, a]), all with retries=2 and retry_delay=5 s; consumers on a, a & b, a | b.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable
from typing import Any

from reproduce import e2e

CHAOS = ("kill-scheduler", "kill-worker", "restart-db")
CHAOS_FIRST = 8.0  # seconds after the first trigger
CHAOS_GAP = 10.0  # between two faults
RESTART_AFTER = 5.0  # seconds a killed process stays down (a supervisor's restart delay)
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379"
CLAIM_KEY = "airflow-dataset-race-fix:e2e-claim"
REDIS_DBS = range(1, 16)  # leave db 0 to whoever uses the default
RETRIES, RETRY_DELAY = 2, 5
# What a task's log says when its database server restarted under it (--chaos restart-db).
CONNECTION_LOST = (
    "server closed the connection",
    "terminating connection",
    "connection already closed",
    "Lost connection",
    "gone away",
    "Connection refused",
    "could not connect",
    "Can't connect",
    "connection to server",
    "shutdown in progress",
    "the database system is",
)


def default_schedulers(backend: str) -> int:
    """Two where Airflow supports HA schedulers (row locks): PostgreSQL. One on MySQL/MariaDB."""
    return 2 if backend == "postgres" else 1


def redis_url() -> str:
    return os.environ.get("ADRF_REDIS_URL", DEFAULT_REDIS_URL).rstrip("/")


class RedisDb:
    """A Redis database index of our own: claimed in an empty database with SET NX, emptied
    (FLUSHDB of that index only) and released at the end."""

    def __init__(self, server: str) -> None:
        import redis

        self.server, self.token, self.index = server, secrets.token_hex(8), None
        for index in REDIS_DBS:
            client = redis.Redis.from_url(f"{server}/{index}", socket_timeout=10)
            if client.dbsize() == 0 and client.set(CLAIM_KEY, self.token, nx=True, ex=6 * 3600):
                if client.dbsize() == 1:  # nobody else wrote in between
                    self.index, self.client = index, client
                    return
                client.delete(CLAIM_KEY)
            client.close()
        raise RuntimeError(
            f"no empty Redis database among {REDIS_DBS.start}-{REDIS_DBS.stop - 1} on {server}"
        )

    @property
    def url(self) -> str:
        return f"{self.server}/{self.index}"

    def release(self) -> None:
        if self.client.get(CLAIM_KEY) == self.token.encode():
            self.client.flushdb()
        self.client.close()


def celery_env(spec: dict[str, Any], broker: str) -> dict[str, str]:
    """CeleryExecutor on ``broker`` (also the result backend), with Airflow's recovery tuned to
    act within the run: zombies after 30 s, orphans adopted within 15 s of a scheduler's death,
    messages a dead worker had reserved redelivered after 45 s, producer retries."""
    return {
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CELERY__BROKER_URL": broker,
        "AIRFLOW__CELERY__RESULT_BACKEND": broker,
        "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(spec["worker_concurrency"]),
        "AIRFLOW__CELERY__SYNC_PARALLELISM": "1",
        "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "45",
        "AIRFLOW__SCHEDULER__SCHEDULER_ZOMBIE_TASK_THRESHOLD": "30",
        "AIRFLOW__SCHEDULER__ZOMBIE_DETECTION_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "15",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "20",
        "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "180",
        "ADRF_E2E_RETRIES": str(RETRIES),
        "ADRF_E2E_RETRY_DELAY": str(RETRY_DELAY),
    }


class Worker(e2e.Supervised):
    """``airflow celery worker`` with its own host name and pid file, no log server."""

    def __init__(
        self, number: int, spec: dict[str, Any], env: dict[str, str], progress, max_restarts: int
    ) -> None:
        home = os.environ["AIRFLOW_HOME"]
        args = [
            "celery",
            "worker",
            "--concurrency",
            str(spec["worker_concurrency"]),
            "--celery-hostname",
            f"worker{number}@adrf-{spec['seed']}-{os.getpid()}",
            "--pid",
            os.path.join(home, f"worker{number}.pid"),
            "--skip-serve-logs",
            "--without-mingle",
            "--without-gossip",
        ]
        super().__init__(
            f"worker {number}", args, env, os.path.join(home, f"worker{number}.log"), progress, max_restarts
        )

    def _start(self):
        try:  # a SIGKILLed worker leaves its pid file behind, and Celery refuses to start on it
            os.unlink(self.args[self.args.index("--pid") + 1])
        except FileNotFoundError:
            pass
        return super()._start()


class Chaos:
    """Faults injected while the producers run, one every CHAOS_GAP seconds from CHAOS_FIRST
    seconds after the first trigger, in the order given. Each is printed with its time."""

    def __init__(self, faults: list[str], spec: dict[str, Any], schedulers, workers, progress) -> None:
        self.pending = list(faults)
        self.spec, self.schedulers, self.workers, self.progress = spec, schedulers, workers, progress
        self.start: float | None = None
        self.restarts: list[tuple[float, e2e.Supervised]] = []
        self.log: list[dict[str, Any]] = []

    def poll(self, producers_active: bool) -> None:
        """Restart what is due; inject the next fault when due and the producers still run."""
        now = time.monotonic()
        if self.start is None:
            self.start = now
        for due, process in list(self.restarts):
            if now >= due:
                process.restart()
                self.restarts.remove((due, process))
                self._record("restart", f"{process.name} started again (pid {process.process.pid})")
        if not producers_active:
            return
        if self.pending and now - self.start >= CHAOS_FIRST + CHAOS_GAP * len(self.log_faults()):
            fault = self.pending.pop(0)
            getattr(self, "_" + fault.replace("-", "_"))()

    def log_faults(self) -> list[dict[str, Any]]:
        return [entry for entry in self.log if entry["fault"] in CHAOS]

    def finish(self) -> list[str]:
        """After the run: notes on faults never injected and on processes still down."""
        notes = [f"chaos: {fault} not injected: the producers finished first" for fault in self.pending]
        notes += [f"chaos: {process.name} was still down at the end" for _, process in self.restarts]
        self.pending, self.restarts = [], []
        return notes

    def _record(self, fault: str, detail: str) -> None:
        elapsed = time.monotonic() - (self.start or time.monotonic())
        utc = dt.datetime.now(dt.timezone.utc).strftime("%H:%M:%S")
        self.log.append({"fault": fault, "at_seconds": round(elapsed, 1), "utc": utc, "detail": detail})
        self.progress(f"CHAOS {utc} UTC (+{elapsed:.1f} s after the first trigger): {fault}: {detail}")

    def _kill(self, fault: str, process: e2e.Supervised) -> None:
        pid = process.process.pid
        killed = process.kill()
        self._record(
            fault,
            f"SIGKILL {process.name} (pid {pid}, {killed} processes with its children); "
            f"restart in {RESTART_AFTER:.0f} s",
        )
        self.restarts.append((time.monotonic() + RESTART_AFTER, process))

    def _kill_scheduler(self) -> None:
        self._kill("kill-scheduler", self.schedulers[0])

    def _kill_worker(self) -> None:
        self._kill("kill-worker", self.workers[0])

    def _restart_db(self) -> None:
        started = time.monotonic()
        detail = restart_database(self.spec["backend"], os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
        self._record("restart-db", f"{detail} ({time.monotonic() - started:.1f} s)")


def restart_database(backend: str, url: str) -> str:
    """Restart the database server on this machine: pg_ctlcluster for PostgreSQL; for MariaDB
    a clean shutdown (mysqladmin) and start-stop-daemon, as .ci/run starts it."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.host not in ("127.0.0.1", "localhost", "::1", None):
        raise RuntimeError(f"--chaos restart-db restarts only a server on this machine, not {parsed.host}")
    if backend == "postgres":
        cluster = os.environ.get("ADRF_PG_CLUSTER") or f"{sorted(os.listdir('/etc/postgresql'))[-1]} main"
        command = ["pg_ctlcluster", "--skip-systemctl-redirect", *cluster.split(), "restart"]
        subprocess.run(command, check=True, timeout=120, capture_output=True)
        _wait_until(
            lambda: _ok(
                ["pg_isready", "-q", "-h", parsed.host or "127.0.0.1", "-p", str(parsed.port or 5432)]
            )
        )
        return " ".join(command)
    if backend == "mysql":
        admin = [
            "mysqladmin",
            "-h",
            parsed.host or "127.0.0.1",
            "-P",
            str(parsed.port or 3306),
            "-u",
            parsed.username or "root",
        ]
        if parsed.password:
            admin.append(f"-p{parsed.password}")
        subprocess.run([*admin, "shutdown"], check=True, timeout=120, capture_output=True)
        _wait_until(lambda: not _ok(["pgrep", "-x", "mariadbd"]) and not _ok(["pgrep", "-x", "mysqld"]))
        start = ["start-stop-daemon", "--start", "--oknodo", "--background", "--exec", "/usr/sbin/mariadbd"]
        subprocess.run(start, check=True, timeout=60, capture_output=True)
        _wait_until(lambda: _ok([*admin, "ping"]))
        return "mysqladmin shutdown; " + " ".join(start)
    raise RuntimeError(f"--chaos restart-db: no restart for {backend}")


def _ok(command: list[str]) -> bool:
    return subprocess.run(command, capture_output=True, timeout=30).returncode == 0


def _wait_until(condition: Callable[[], bool], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the database server did not come back within 90 s")
        time.sleep(0.5)


def run(spec: dict[str, Any], progress: Callable[[str], None]) -> dict[str, Any]:
    if spec["backend"] == "sqlite":  # the runner refuses it first; Airflow refuses it too
        raise RuntimeError("CeleryExecutor cannot run on SQLite")
    spec = {
        **spec,
        "triggers": spec.get("triggers") or e2e.default_triggers(spec["backend"]),
        "schedulers": spec.get("schedulers") or default_schedulers(spec["backend"]),
        "mapped_multi": spec.get("mapped_multi") or 8,
    }
    home = os.environ["AIRFLOW_HOME"]
    e2e.install_dags(home)
    redis_db = RedisDb(redis_url())
    processes: list[e2e.Supervised] = []
    chaos = None
    try:
        progress(
            f"Redis database {redis_db.url} claimed; {spec['schedulers']} scheduler(s), "
            f"{spec['workers']} worker(s) x {spec['worker_concurrency']} slots; "
            f"chaos: {', '.join(spec.get('chaos') or []) or 'none'}"
        )
        env = e2e.process_env(spec, celery_env(spec, redis_db.url))
        # --stock-schedulers: the first N schedulers of the fixed variant run stock Airflow (an
        # HA pair half way through a rolling upgrade)
        stock_env = e2e.process_env({**spec, "variant": "stock"}, celery_env(spec, redis_db.url))
        stock_schedulers = min(spec.get("stock_schedulers") or 0, spec["schedulers"])
        if stock_schedulers:
            progress(
                f"mixed: scheduler(s) 1-{stock_schedulers} run stock Airflow, the rest "
                "and the workers the fix"
            )
        max_restarts = e2e.Supervised.MAX_RESTARTS + 2 * len(spec.get("chaos") or [])
        started = time.monotonic()
        schedulers = [
            e2e.Scheduler(
                stock_env if n <= stock_schedulers else env,
                os.path.join(home, f"scheduler{n}.log"),
                progress,
                f"scheduler {n}",
                max_restarts,
            )
            for n in range(1, spec["schedulers"] + 1)
        ]
        processes += schedulers
        workers = [Worker(n, spec, env, progress, max_restarts) for n in range(1, spec["workers"] + 1)]
        processes += workers
        chaos = Chaos(list(spec.get("chaos") or []), spec, schedulers, workers, progress)
        result = e2e.drive(
            spec, e2e.layout(spec), processes, started, progress, on_poll=chaos.poll, extra_notes=chaos.finish
        )
    finally:
        e2e.stop_all(processes)  # idempotent: drive stopped them already unless it failed first
        redis_db.release()
    result["faults"] = chaos.log
    crashes = [crash for process in processes for crash in process.crashes]
    if (
        "restart-db" in (spec.get("chaos") or [])
        and crashes
        and all(any(text in crash for text in CONNECTION_LOST) for crash in crashes)
    ):
        # Processes that died of the database restart (and were restarted): the fault, not a finding.
        result["problems"].pop("scheduler_crashes", None)
        result["notes"].append(f"{len(crashes)} process(es) died of the database restart and were restarted")
    result["topology"] = {
        "executor": "CeleryExecutor",
        "broker": redis_db.url,
        "schedulers": spec["schedulers"],
        "stock_schedulers": stock_schedulers,
        "workers": spec["workers"],
        "worker_concurrency": spec["worker_concurrency"],
        "producers": {dag_id: e2e.layout(spec).tasks(dag_id) for dag_id in e2e.layout(spec).producers},
        "retries": RETRIES,
        "retry_delay": RETRY_DELAY,
    }
    if result.get("producer_tis_retried_list"):
        result["retry_causes"] = retry_causes(os.path.join(home, "logs"), result["producer_tis_retried_list"])
        # A try that failed on a database error other than a lost connection (a deadlock, a lock
        # timeout) is a failure of the producer's transaction that no injected fault explains.
        on_error = sum(
            n
            for cause, n in result["retry_causes"].items()
            if cause.startswith("error:") and not any(text in cause for text in CONNECTION_LOST)
        )
        if on_error:
            result["problems"]["producer_tries_failed_on_db_error"] = on_error
            progress(f"producer tries failed on a database error: {on_error}")
    if spec.get("keep_logs"):
        shutil.copytree(os.path.join(home, "logs"), spec["keep_logs"], dirs_exist_ok=True)
    return result


def retry_causes(logs: str, retried: list[str]) -> dict[str, int]:
    """Why the earlier tries of retried producer tasks ended: the first database error of each
    try's log with the statement it failed on, or 'killed' when the log just stops (a SIGKILLed
    worker, a zombie: at Airflow's WARNING log level a try that was cut off logs nothing)."""
    from collections import Counter

    causes: Counter[str] = Counter()
    for entry in retried:
        key, tries = entry.split(": ", 1)  # "dag/task[map] run_id", "try 1: failed, try 2: success"
        dag_task, run_id = key.split(" ", 1)
        dag_id, rest = dag_task.split("/", 1)
        task_id, map_index = rest.rstrip("]").split("[")
        folder = os.path.join(logs, f"dag_id={dag_id}", f"run_id={run_id}", f"task_id={task_id}")
        if int(map_index) >= 0:
            folder = os.path.join(folder, f"map_index={map_index}")
        last = int(tries.split(", ")[-1].split(":")[0].split()[1])
        for number in range(1, last):  # every try but the last one, recorded in the history or not
            try:
                with open(os.path.join(folder, f"attempt={number}.log"), errors="replace") as handle:
                    lines = handle.read().splitlines()
            except FileNotFoundError:
                # Airflow counted a try that never ran: the task was reset while queued (orphaned
                # by a dead scheduler, or stuck in the queue of a dead worker) and queued again.
                causes["reset while queued (no log)"] += 1
                continue
            at = next(
                (
                    i
                    for i, line in enumerate(lines)
                    if "Error" in line and ("sqlalchemy" in line or "Exception" in line or "Error:" in line)
                ),
                None,
            )
            if at is None:
                causes["killed (its log just stops)"] += 1
                continue
            error = lines[at].split("] ", 1)[-1].strip()[:120]
            statement = next((line.strip()[:90] for line in lines[at:] if line.startswith("[SQL: ")), "")
            causes[f"error: {error}" + (f" on {statement}" if statement else "")] += 1
    return dict(causes)
