"""
What the web page (Browse > Dataset runs) costs a request on a large metadata database (issue 31, item 8).

A scratch database on PostgreSQL (or MariaDB) with 200 dataset-triggered DAGs, a few runs
each, and one DAG whose first run consumed 50 000 events; a real webserver (one gthread
worker) and one request at a time: the list (first page, and sorted by pending events),
the big DAG's page and its JSON. Measured twice: with the statistics behind (the last
ANALYZE before the bulk load, as a server with autovacuum off leaves them) and fresh.

    ADRF_BACKEND=postgres .tox/airflow2104-postgres/bin/python tests/web_bench.py

ADRF_BENCH_SAMPLES=N measures each request N times; ADRF_BENCH_EXPLAIN_MS=100 (PostgreSQL)
logs the plan of every statement slower than 100 ms to the server's log (auto_explain).

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
PASSWORD = "adrf-web-bench-1"
TIMEOUT = 120  # seconds a statement may run (PostgreSQL)
SAMPLES = int(os.environ.get("ADRF_BENCH_SAMPLES", "1"))
# PostgreSQL: log the plan of every statement slower than this many ms to the server's log (auto_explain)
EXPLAIN_MS = os.environ.get("ADRF_BENCH_EXPLAIN_MS")


def build(prefix_note: str = "") -> dict:
    from sqlalchemy import insert, select, text

    from airflow import settings
    from airflow.models.dagrun import DagRun
    from airflow.models.dataset import DatasetEvent, DatasetModel, association_table
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType

    from reproduce.harness.world import World

    w = World("bench")
    a, b = w.dataset("a"), w.dataset("b")
    many = w.consumers("c", [a], DAGS)
    big = w.consumer("big", [b])
    producer, scheduler = w.producer("p"), w.scheduler()
    for _ in range(2):  # every small DAG has runs and consumed events
        w.emit(producer, a), producer.finish()
        w.loop(scheduler), scheduler.finish()
    w.emit(producer, a), producer.finish()  # and one pending event
    w.close()
    if settings.engine.dialect.name == "postgresql":
        with settings.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ANALYZE"))  # the last statistics: before the bulk load
    with create_session() as session:
        dataset_id = session.scalar(select(DatasetModel.id).where(DatasetModel.uri == b.uri))
    end = datetime.now(timezone.utc) - timedelta(minutes=1)
    instants = [end - timedelta(minutes=10) * (BIG - i) / BIG for i in range(BIG)]
    with create_session() as session:
        for start in range(0, BIG, 5000):
            session.execute(
                insert(DatasetEvent),
                [{"dataset_id": dataset_id, "timestamp": t, "extra": {"n": start + i}, "source_dag_id": "producer",
                  "source_task_id": "emit", "source_run_id": "bulk", "source_map_index": -1}
                 for i, t in enumerate(instants[start : start + 5000])],
            )
        session.execute(insert(DagRun), [{
            "dag_id": big, "run_id": "dataset_triggered__first", "execution_date": end, "state": DagRunState.SUCCESS,
            "run_type": DagRunType.DATASET_TRIGGERED, "external_trigger": False, "data_interval_start": instants[0],
            "data_interval_end": instants[-1], "queued_at": end, "start_date": end, "end_date": end, "clear_number": 0}])
        run_id = session.scalar(select(DagRun.id).where(DagRun.dag_id == big))
        ids = list(session.scalars(select(DatasetEvent.id).where(DatasetEvent.dataset_id == dataset_id)))
        for start in range(0, len(ids), 5000):
            session.execute(insert(association_table), [{"dag_run_id": run_id, "event_id": i} for i in ids[start : start + 5000]])
    return {"big": big, "first": min(many)}


def _airflow(env: dict, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "airflow", *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def login(base: str):
    import requests

    session = requests.Session()
    page = session.get(f"{base}/login/", timeout=30).text
    token = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', page).group(1)
    session.post(f"{base}/login/", data={"username": "admin", "password": PASSWORD, "csrf_token": token}, timeout=30)
    return session


def measure(base: str, session, dags: dict) -> dict[str, tuple[float, int, int]]:
    pages = {
        "list": "/dataset-race-fix/",
        "list by pending": "/dataset-race-fix/?sort=pending",
        "DAG page": f"/dataset-race-fix/dag/{dags['big']}",
        "JSON": f"/dataset-race-fix/dag/{dags['big']}/json",
    }
    result = {}
    for name, path in pages.items():
        started = time.monotonic()
        answer = session.get(base + path, timeout=600)
        result[name] = (time.monotonic() - started, answer.status_code, len(answer.content))
    return result


def main() -> None:
    import requests

    database = ScratchDatabase(BACKEND)
    database.create()
    home = tempfile.TemporaryDirectory(prefix="adrf-web-bench-")
    configure_airflow_env(database.url, home.name)
    server = None
    try:
        init_airflow_db()
        dags = build()
        from airflow import settings

        if settings.engine.dialect.name == "postgresql":  # a request that would run for minutes fails at 2
            database._admin(f'ALTER DATABASE "{database.name}" SET statement_timeout = \'{TIMEOUT}s\'')
            if EXPLAIN_MS:
                for setting in ("session_preload_libraries = 'auto_explain'", f"auto_explain.log_min_duration = {int(EXPLAIN_MS)}",
                                "auto_explain.log_analyze = on", "auto_explain.log_timing = off"):
                    database._admin(f'ALTER DATABASE "{database.name}" SET {setting}')
                print(f"plans of statements over {EXPLAIN_MS} ms: the server's log, database {database.name}")

        env = {**os.environ, "AIRFLOW__WEBSERVER__SECRET_KEY": "adrf-web-bench", "AIRFLOW__WEBSERVER__WORKERS": "1",
               "AIRFLOW__WEBSERVER__WORKER_CLASS": "gthread", "AIRFLOW__WEBSERVER__WEB_SERVER_HOST": "127.0.0.1",
               "AIRFLOW__WEBSERVER__WEB_SERVER_WORKER_TIMEOUT": "600"}
        env.pop("PYTHONPATH", None)
        _airflow(env, "users", "create", "--role", "Admin", "--username", "admin", "--password", PASSWORD,
                 "--firstname", "A", "--lastname", "Dmin", "--email", "admin@example.com")
        from webdriver import free_port

        port = free_port()
        log = open(os.path.join(home.name, "webserver.log"), "w")
        server = subprocess.Popen([sys.executable, "-m", "airflow", "webserver", "--port", str(port)], env=env,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        for _ in range(180):
            try:
                if requests.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(1)
        session = login(base)
        session.get(f"{base}/home", timeout=60)  # the worker's first request: imports, the DAG bag
        rounds = {}
        for state in ("behind", "fresh"):
            if state == "fresh" and settings.engine.dialect.name == "postgresql":
                with settings.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                    from sqlalchemy import text

                    conn.execute(text("ANALYZE"))
            rounds[state] = [measure(base, session, dags) for _ in range(SAMPLES)]
        print(f"\n{BACKEND}: {DAGS} DAGs, one whose first run consumed {BIG} events; seconds per request, status, bytes")
        for state, samples in rounds.items():
            for name in samples[0]:
                times = " ".join(f"{s[name][0]:7.2f}" for s in samples)
                print(f"  statistics {state:6}  {name:16} {times}   {samples[-1][name][1]}  {samples[-1][name][2]:>10}")
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(30)
        from airflow import settings

        settings.dispose_orm()
        database.drop()
        home.cleanup()


if __name__ == "__main__":
    main()
