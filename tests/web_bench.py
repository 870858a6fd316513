"""
What the web page (Browse > Dataset runs) costs a request on a large metadata database (issue 31, item 8).

A scratch database on PostgreSQL (or MariaDB) with 200 dataset-triggered DAGs, a few runs
each, and a new DAG on a busy dataset (50 000 bulk-loaded events of the last ten minutes, each
consumed by a run of the dataset's older consumer): first with them pending (no run yet),
then after its first run consumed them all. A real webserver (one gthread worker) and one
request at a time: the list (first page, filtered for the big DAG, and sorted by pending
events), the big DAG's page and its JSON. In three statistics states (issue 49), each on a
database of its own: never analyzed (as a bulk load or a restore leaves the tables; this
server runs with autovacuum off), behind (the last ANALYZE before the bulk loads) and fresh
(ANALYZE after each load). ADRF_BACKEND: postgres, mysql or sqlite.

    ADRF_BACKEND=postgres .tox/airflow2104-postgres/bin/python tests/web_bench.py

ADRF_BENCH_STATES="never analyzed,fresh" chooses states; ADRF_BENCH_SAMPLES=N measures each
request N times; ADRF_BENCH_EXPLAIN_MS=100 (PostgreSQL) logs the plan of every statement slower
than 100 ms to the server's log (auto_explain).

Not a test (pytest does not collect it): a measurement, printed as a table.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the clone: the lab (reproduce/)

from reproduce.harness.database import ScratchDatabase, configure_airflow_env, init_airflow_db  # noqa: E402

BACKEND = os.environ.get("ADRF_BACKEND", "postgres")
DAGS = 200
BIG = 50_000
BUSY_RUN = 500  # events a run of the dataset's older consumer took
PASSWORD = "adrf-web-bench-1"
TIMEOUT = 120  # seconds a statement may run (PostgreSQL)
SAMPLES = int(os.environ.get("ADRF_BENCH_SAMPLES", "1"))
# PostgreSQL: log the plan of every statement slower than this many ms to the server's log (auto_explain)
EXPLAIN_MS = os.environ.get("ADRF_BENCH_EXPLAIN_MS")


STATES = ("never analyzed", "behind", "fresh")


def analyze() -> None:
    """Every table's statistics, as autovacuum or a DBA's ANALYZE takes them."""
    from airflow import settings
    from sqlalchemy import inspect, text

    with settings.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if conn.dialect.name == "mysql":
            quote = conn.dialect.identifier_preparer.quote  # `trigger`
            conn.execute(
                text("ANALYZE TABLE " + ", ".join(quote(name) for name in inspect(conn).get_table_names()))
            )
        else:
            conn.execute(text("ANALYZE"))


def build(state: str) -> dict:
    """The 200 DAGs, then the big DAG's 50 000 pending events (bulk-loaded, queued for it)."""
    from airflow.models.dataset import DatasetDagRunQueue, DatasetEvent, DatasetModel
    from airflow.utils.session import create_session
    from sqlalchemy import insert, select

    from reproduce.harness.world import World

    w = World("bench")
    a, b = w.dataset("a"), w.dataset("b")
    many = w.consumers("c", [a], DAGS)
    big, busy = w.consumer("big", [b]), w.consumer("busy", [b])
    producer, scheduler = w.producer("p"), w.scheduler()
    for _ in range(2):  # every small DAG has runs and consumed events
        w.emit(producer, a), producer.finish()
        w.loop(scheduler), scheduler.finish()
    w.emit(producer, a), producer.finish()  # and one pending event
    w.close()
    if state == "behind":
        analyze()  # the last statistics: before the bulk load
    with create_session() as session:
        dataset_id = session.scalar(select(DatasetModel.id).where(DatasetModel.uri == b.uri))
    end = datetime.now(timezone.utc) - timedelta(minutes=1)
    instants = [end - timedelta(minutes=10) * (BIG - i) / BIG for i in range(BIG)]
    with create_session() as session:
        for start in range(0, BIG, 5000):
            session.execute(
                insert(DatasetEvent),
                [
                    {
                        "dataset_id": dataset_id,
                        "timestamp": t,
                        "extra": {"n": start + i},
                        "source_dag_id": "producer",
                        "source_task_id": "emit",
                        "source_run_id": "bulk",
                        "source_map_index": -1,
                    }
                    for i, t in enumerate(instants[start : start + 5000])
                ],
            )
        session.add(DatasetDagRunQueue(dataset_id=dataset_id, target_dag_id=big, created_at=instants[0]))
    dags = {"big": big, "first": min(many), "dataset_id": dataset_id, "instants": instants}
    for n in range(0, BIG, BUSY_RUN):  # the dataset's older consumer ran all along: a run per 500 events
        consume(state, {**dags, "big": busy, "instants": instants[n : n + BUSY_RUN]}, f"__{n}")
    if state == "fresh":
        analyze()
    return dags


def consume(state: str, dags: dict, suffix: str = "") -> None:
    """The big DAG's first run, consuming its ``instants``' events (bulk-loaded too), its queue row gone."""
    from airflow.models.dagrun import DagRun
    from airflow.models.dataset import DatasetDagRunQueue, DatasetEvent, association_table
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType
    from sqlalchemy import delete, insert, select

    big, instants = dags["big"], dags["instants"]
    end = instants[-1] + timedelta(seconds=1)
    with create_session() as session:
        session.execute(
            insert(DagRun),
            [
                {
                    "dag_id": big,
                    "run_id": f"dataset_triggered__first{suffix}",
                    "execution_date": end,
                    "state": DagRunState.SUCCESS,
                    "run_type": DagRunType.DATASET_TRIGGERED,
                    "external_trigger": False,
                    "data_interval_start": instants[0],
                    "data_interval_end": instants[-1],
                    "queued_at": end,
                    "start_date": end,
                    "end_date": end,
                    "clear_number": 0,
                }
            ],
        )
        run_id = session.scalar(select(DagRun.id).where(DagRun.dag_id == big, DagRun.execution_date == end))
        ids = list(
            session.scalars(
                select(DatasetEvent.id).where(
                    DatasetEvent.dataset_id == dags["dataset_id"],
                    DatasetEvent.timestamp.between(instants[0], instants[-1]),
                )
            )
        )
        for start in range(0, len(ids), 5000):
            session.execute(
                insert(association_table),
                [{"dag_run_id": run_id, "event_id": i} for i in ids[start : start + 5000]],
            )
        session.execute(delete(DatasetDagRunQueue).where(DatasetDagRunQueue.target_dag_id == big))
    if state == "fresh" and not suffix:
        analyze()


def _airflow(env: dict, *args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "airflow", *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]


def login(base: str):
    import requests

    session = requests.Session()
    page = session.get(f"{base}/login/", timeout=30).text
    token = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', page).group(1)
    session.post(
        f"{base}/login/", data={"username": "admin", "password": PASSWORD, "csrf_token": token}, timeout=30
    )
    return session


def measure(base: str, session, dags: dict) -> dict[str, tuple[float, int, int]]:
    pages = {
        "list": "/dataset-race-fix/",
        "list by pending": "/dataset-race-fix/?sort=pending",
        "list, filter big": f"/dataset-race-fix/?filter={dags['big']}",
        "DAG page": f"/dataset-race-fix/dag/{dags['big']}",
        "JSON": f"/dataset-race-fix/dag/{dags['big']}/json",
    }
    result = {}
    for name, path in pages.items():
        started, cpu = time.monotonic(), cpu_seconds(dags["pgid"], dags["database"])
        answer = session.get(base + path, timeout=600)
        cpu = cpu_seconds(dags["pgid"], dags["database"]) - cpu
        result[name] = (time.monotonic() - started, answer.status_code, len(answer.content), cpu)
    return result


def cpu_seconds(pgid: int, database: str | None) -> float:
    """
    CPU time so far of the webserver's processes (process group ``pgid``) and, on PostgreSQL, of
    the server's backends on ``database``: what a request costs whatever else the machine runs
    (this machine's 2 cores are shared; wall time follows their load).
    """
    pids = []
    if database:
        import psycopg2

        with (
            psycopg2.connect(host="127.0.0.1", user="postgres", dbname="postgres") as conn,
            conn.cursor() as cursor,
        ):
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (database,))
            pids = [str(pid) for (pid,) in cursor.fetchall()]
    total = 0
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields[2]: the process group; [11], [12]: user, system ticks
        if int(fields[2]) == pgid or pid in pids:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def one_state(state: str) -> dict[str, list[dict]]:
    """A fresh database in ``state``, a webserver on it: each case's requests, SAMPLES times."""
    import requests

    database = ScratchDatabase(BACKEND)
    database.create()
    home = tempfile.TemporaryDirectory(prefix="adrf-web-bench-")
    configure_airflow_env(database.url, home.name)
    server, cases = None, {}
    try:
        init_airflow_db()
        dags = build(state)
        from airflow import settings

        if settings.engine.dialect.name == "postgresql":  # a request that would run for minutes fails at 2
            database._admin(f"ALTER DATABASE \"{database.name}\" SET statement_timeout = '{TIMEOUT}s'")
            if EXPLAIN_MS:
                for setting in (
                    "session_preload_libraries = 'auto_explain'",
                    f"auto_explain.log_min_duration = {int(EXPLAIN_MS)}",
                    "auto_explain.log_analyze = on",
                    "auto_explain.log_timing = off",
                ):
                    database._admin(f'ALTER DATABASE "{database.name}" SET {setting}')
                print(
                    f"plans of statements over {EXPLAIN_MS} ms: the server's log, database {database.name}",
                    flush=True,
                )

        env = {
            **os.environ,
            "AIRFLOW__WEBSERVER__SECRET_KEY": "adrf-web-bench",
            "AIRFLOW__WEBSERVER__WORKERS": "1",
            "AIRFLOW__WEBSERVER__WORKER_CLASS": "gthread",
            "AIRFLOW__WEBSERVER__WEB_SERVER_HOST": "127.0.0.1",
            "AIRFLOW__WEBSERVER__WEB_SERVER_WORKER_TIMEOUT": "600",
        }
        env["PYTHONPATH"] = str(
            Path(__file__).resolve().parents[1] / "src"
        )  # this clone's page, without the shim
        env.pop(
            "AIRFLOW__SCHEDULER__MIN_SERIALIZED_DAG_FETCH_INTERVAL", None
        )  # the tests' 0; a deployment's 10 s
        _airflow(
            env,
            "users",
            "create",
            "--role",
            "Admin",
            "--username",
            "admin",
            "--password",
            PASSWORD,
            "--firstname",
            "A",
            "--lastname",
            "Dmin",
            "--email",
            "admin@example.com",
        )
        from webdriver import free_port

        port = free_port()
        log = open(os.path.join(home.name, "webserver.log"), "w")
        server = subprocess.Popen(
            [sys.executable, "-m", "airflow", "webserver", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        base = f"http://127.0.0.1:{port}"
        for _ in range(180):
            try:
                if requests.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(1)
        dags.update(pgid=server.pid, database=database.name if BACKEND == "postgres" else None)
        session = login(base)
        session.get(f"{base}/home", timeout=60)  # the worker's first request: imports, the DAG bag
        cases["50 000 pending, no run"] = [measure(base, session, dags) for _ in range(SAMPLES)]
        consume(state, dags)
        cases["after a run consumed them"] = [measure(base, session, dags) for _ in range(SAMPLES)]
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(30)
        from airflow import settings

        settings.dispose_orm()
        database.drop()
        home.cleanup()
    return cases


def main() -> None:
    one = os.environ.get("ADRF_BENCH_ONE_STATE")
    if one:
        for case, samples in one_state(one).items():
            for name in samples[0]:
                times = " ".join(f"{s[name][0]:6.2f} ({s[name][3]:.2f})" for s in samples)
                print(
                    f"  {one:14}  {case:26}  {name:16} {times}   {samples[-1][name][1]}  "
                    f"{samples[-1][name][2]:>10}",
                    flush=True,
                )
        return
    states = [s.strip() for s in os.environ.get("ADRF_BENCH_STATES", ",".join(STATES)).split(",")]
    print(
        f"{BACKEND}: {DAGS} DAGs and a big one on {BIG} events; seconds per request (CPU seconds of the "
        "webserver and, PostgreSQL, its backends), status, bytes",
        flush=True,
    )
    for (
        state
    ) in states:  # a process and a fresh database each: PostgreSQL keeps a table's statistics across loads
        subprocess.run(
            [sys.executable, __file__], env={**os.environ, "ADRF_BENCH_ONE_STATE": state}, check=True
        )


if __name__ == "__main__":
    main()
