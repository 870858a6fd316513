"""
Time ``audit`` on a large synthetic metadata database (outside the test suite).

For each backend asked for, in a child process: create a scratch database, create
Airflow's schema, bulk-load about 1,000,000 dataset events and 100,000 DAG runs with
known damage (suspected-lost events, doubled events, empty runs, out-of-order runs,
stale queue rows), ANALYZE, then time the audit twice (in-process ``invariant.audit``,
and the CLI ``airflow-dataset-race-fix audit --db-url ... --json`` as a user runs it) and
compare its counts with the ones the generator planted. The database is dropped at the end
(``--keep`` keeps it and prints its URL).

    .tox/airflow2104-postgres/bin/python reproduce/audit_large_db.py postgres mysql sqlite

Shape (defaults): 10 datasets x 100,000 events, 13 consumer DAGs (10 on one dataset, two on
``a | b``, one on ``a & b``), about 81,000 dataset-triggered runs consuming about 1.6M
(event, run) pairs, and 18,000 scheduled runs of 4 other DAGs.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

if __name__ == "__main__":  # a script: the clone on sys.path, not reproduce/ (its reproduce.py is no package)
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BASE = datetime(2025, 1, 1, tzinfo=timezone.utc)
DATASETS = 10
SCHEDULED_DAGS = 4


@dataclass
class Plan:
    """Everything to insert, plus the counts the audit must find."""

    events: list[tuple[int, int, datetime]] = field(default_factory=list)  # id, dataset index, ts
    runs: list[tuple[str, datetime, str]] = field(
        default_factory=list
    )  # dag_id, date, run_type (id = index + 1)
    consumed: list[tuple[int, int]] = field(default_factory=list)  # run id, event id
    queue: list[tuple[int, str, datetime]] = field(default_factory=list)  # dataset index, dag_id, created_at
    expected: dict[str, int] = field(default_factory=dict)


def consumers() -> dict[str, tuple[str, list[int]]]:
    """dag_id -> (condition kind, dataset indexes)."""
    dags = {f"single_{k}": ("single", [k]) for k in range(DATASETS)}
    dags.update({"any_0_1": ("any", [0, 1]), "any_2_3": ("any", [2, 3]), "all_4_5": ("all", [4, 5])})
    return dags


def build_plan(n_events: int, n_runs: int, seed: int) -> Plan:
    rng = random.Random(seed)
    plan = Plan()
    per_dataset: dict[int, list[tuple[int, datetime]]] = defaultdict(list)
    for event_id in range(1, n_events + 1):
        ds = event_id % DATASETS
        ts = BASE + timedelta(seconds=3 * event_id)
        plan.events.append((event_id, ds, ts))
        per_dataset[ds].append((event_id, ts))

    dags = consumers()
    tail = 5  # newest events of each DAG stay pending, with queue rows
    dt_share = int(n_runs * 0.82)
    stream_sizes = {d: sum(len(per_dataset[k]) for k in ks) for d, (_, ks) in dags.items()}
    windows_per_dag = max(1, dt_share // len(dags))
    runs: list[tuple[str, datetime, list[int]]] = []  # dag_id, date, events (DT runs in time order)
    late_runs: list[tuple[str, datetime, list[int]]] = []  # created last: out of order
    for dag_id, (_, ks) in dags.items():
        stream = sorted((e for k in ks for e in per_dataset[k]), key=lambda e: e[1])
        body = stream[:-tail]
        size = max(2, stream_sizes[dag_id] // windows_per_dag)
        windows = [body[i : i + size] for i in range(0, len(body), size)]
        dag_runs: list[tuple[str, datetime, list[int]]] = []
        for index, window in enumerate(windows):
            ids = [e[0] for e in window]
            if len(ids) > 2 and rng.random() < 0.002:  # lost: not the newest of its window
                ids.pop(rng.randrange(1, len(ids) - 1))
            if index and rng.random() < 0.002:  # doubled: the previous run also took it
                dag_runs[-1][2].append(window[0][0])
            dag_runs.append((dag_id, window[-1][1], ids))
            if rng.random() < 0.002:  # empty run just after this one
                dag_runs.append((dag_id, window[-1][1] + timedelta(milliseconds=1), []))
        for _ in range(3):  # out of order: dated in the past, created last, consuming again
            victim = rng.choice(dag_runs[1:-1])
            late_runs.append((dag_id, victim[1] - timedelta(milliseconds=2), victim[2][:1]))
        runs.extend(dag_runs)
        queued_at = stream[-1][1]
        if dag_id in ("single_0", "single_1", "single_2"):
            queued_at = dag_runs[-1][1] - timedelta(hours=1)  # stale: older than the latest run
        for k in ks:
            plan.queue.append((k, dag_id, queued_at))

    scheduled = [
        (f"scheduled_{i % SCHEDULED_DAGS}", BASE + timedelta(minutes=15 * i), [])
        for i in range(max(0, n_runs - len(runs) - len(late_runs)))
    ]
    ordered = sorted(runs + scheduled, key=lambda r: r[1]) + late_runs
    for run_id, (dag_id, date, ids) in enumerate(ordered, start=1):
        kind = "scheduled" if dag_id.startswith("scheduled_") else "dataset_triggered"
        plan.runs.append((dag_id, date, kind))
        plan.consumed.extend((run_id, event_id) for event_id in ids)
    plan.expected = expected_counts(plan, dags, per_dataset)
    return plan


def expected_counts(plan: Plan, dags, per_dataset) -> dict[str, int]:
    """The audit's counters, computed naively in Python from the plan (an independent oracle)."""
    run_of = {i: plan.runs[i - 1] for i in range(1, len(plan.runs) + 1)}
    times: dict[tuple[str, int], int] = defaultdict(int)
    consumed_by: dict[int, int] = defaultdict(int)
    for run_id, event_id in plan.consumed:
        times[run_of[run_id][0], event_id] += 1
        consumed_by[run_id] += 1
    latest: dict[str, datetime] = {}
    for dag_id, date, kind in plan.runs:
        if kind == "dataset_triggered":
            latest[dag_id] = max(date, latest.get(dag_id, date))
    counts = defaultdict(int)
    for dag_id, (_, ks) in dags.items():
        for k in ks:
            for event_id, ts in per_dataset[k]:
                n = times.get((dag_id, event_id), 0)
                counts["produced"] += 1
                counts["consumed"] += n > 0
                counts["doubled"] += n > 1
                counts["suspected_lost"] += n == 0 and ts < latest[dag_id]
    running_max: dict[str, datetime] = {}
    for run_id, (dag_id, date, kind) in run_of.items():
        if kind != "dataset_triggered":
            continue
        counts["runs"] += 1
        counts["empty_runs"] += consumed_by[run_id] == 0
        counts["out_of_order"] += dag_id in running_max and running_max[dag_id] > date
        running_max[dag_id] = max(date, running_max.get(dag_id, date))
    counts["stale_queue_rows"] = sum(1 for _, dag_id, created in plan.queue if created < latest[dag_id])
    return dict(counts)


# -- loading ----------------------------------------------------------------------------
def create_dags() -> dict[int, int]:
    """Write the DAGs as the scheduler would; returns dataset index -> dataset id."""
    from airflow.datasets import Dataset, DatasetAll, DatasetAny
    from airflow.models.dag import DAG
    from airflow.models.dataset import DatasetModel
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.operators.empty import EmptyOperator
    from airflow.utils.session import create_session
    from sqlalchemy import select

    datasets = [Dataset(f"synthetic://large/{k}") for k in range(DATASETS)]
    conditions = {
        "single": lambda ds: ds,
        "any": lambda ds: DatasetAny(*ds),
        "all": lambda ds: DatasetAll(*ds),
    }
    dags = []
    for dag_id, (kind, ks) in consumers().items():
        dags.append(
            DAG(dag_id, schedule=conditions[kind]([datasets[k] for k in ks]), start_date=BASE, catchup=False)
        )
    dags += [
        DAG(f"scheduled_{i}", schedule="@daily", start_date=BASE, catchup=False)
        for i in range(SCHEDULED_DAGS)
    ]
    for dag in dags:
        EmptyOperator(task_id="work", dag=dag)
    with create_session() as session:
        DAG.bulk_write_to_db(dags, session=session)
        for dag in dags:
            SerializedDagModel.write_dag(dag, session=session)
        ids = dict(session.execute(select(DatasetModel.uri, DatasetModel.id)).all())
    return {k: ids[d.uri] for k, d in enumerate(datasets)}


def _ts(value: datetime, backend: str) -> str:
    text = value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
    return text + "+00" if backend == "postgres" else text


def bulk_insert(raw, backend: str, table: str, columns: list[str], rows) -> None:
    cursor = raw.cursor()
    if backend == "postgres":  # COPY: an order of magnitude faster than INSERTs
        chunk = io.StringIO()
        for row in rows:
            chunk.write("\t".join("\\N" if v is None else str(v) for v in row) + "\n")
        chunk.seek(0)
        cursor.copy_expert(f"COPY {table} ({', '.join(columns)}) FROM STDIN", chunk)
    else:
        mark = "?" if backend == "sqlite" else "%s"
        sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join([mark] * len(columns))})"
        batch: list = []
        for row in rows:
            batch.append(row)
            if len(batch) >= 10_000:
                cursor.executemany(sql, batch)
                batch = []
        if batch:
            cursor.executemany(sql, batch)
    cursor.close()


def load(plan: Plan, dataset_ids: dict[int, int], backend: str, log) -> None:
    from airflow import settings

    started = time.monotonic()
    raw = settings.engine.raw_connection()
    try:
        cursor = raw.cursor()
        if backend == "mysql":
            cursor.execute("SET foreign_key_checks = 0, unique_checks = 0")
        cursor.close()
        bulk_insert(
            raw,
            backend,
            "dataset_event",
            ["id", "dataset_id", "extra", "timestamp"],
            ((i, dataset_ids[k], "{}", _ts(ts, backend)) for i, k, ts in plan.events),
        )
        log(f"  {len(plan.events):,} events in {time.monotonic() - started:.0f}s")
        bulk_insert(
            raw,
            backend,
            "dag_run",
            [
                "id",
                "dag_id",
                "execution_date",
                "run_id",
                "run_type",
                "state",
                "external_trigger",
                "clear_number",
            ],
            (
                (
                    i,
                    dag_id,
                    _ts(date, backend),
                    f"{kind}__{date.isoformat()}",
                    kind,
                    "success",
                    "false" if backend == "postgres" else 0,
                    0,
                )
                for i, (dag_id, date, kind) in enumerate(plan.runs, start=1)
            ),
        )
        log(f"  {len(plan.runs):,} runs in {time.monotonic() - started:.0f}s")
        bulk_insert(raw, backend, "dagrun_dataset_event", ["dag_run_id", "event_id"], plan.consumed)
        log(f"  {len(plan.consumed):,} consumed (run, event) pairs in {time.monotonic() - started:.0f}s")
        bulk_insert(
            raw,
            backend,
            "dataset_dag_run_queue",
            ["dataset_id", "target_dag_id", "created_at"],
            ((dataset_ids[k], dag_id, _ts(ts, backend)) for k, dag_id, ts in plan.queue),
        )
        cursor = raw.cursor()
        if backend == "postgres":
            cursor.execute("SELECT setval('dataset_event_id_seq', (SELECT max(id) FROM dataset_event))")
            cursor.execute("SELECT setval('dag_run_id_seq', (SELECT max(id) FROM dag_run))")
        raw.commit()
        analyze = {
            "postgres": ["ANALYZE"],
            "mysql": ["ANALYZE TABLE dataset_event, dag_run, dagrun_dataset_event, dataset_dag_run_queue"],
            "sqlite": ["ANALYZE"],
        }[backend]
        for statement in analyze:
            cursor.execute(statement)
            if backend == "mysql":
                cursor.fetchall()
        raw.commit()
        cursor.close()
    finally:
        raw.close()
    log(f"  loaded and analyzed in {time.monotonic() - started:.0f}s")


# -- timing -----------------------------------------------------------------------------
def time_audit(url: str, plan: Plan) -> dict:
    from airflow import settings

    from airflow_dataset_race_fix.diagnostics import invariant

    results: dict = {}
    session = settings.Session()
    try:
        started = time.monotonic()
        audit = invariant.audit(session, limit=20, progress=lambda done, total: None)
        results["in_process_seconds"] = round(time.monotonic() - started, 2)
    finally:
        session.close()
    totals = audit.report.totals()
    names = [
        "produced",
        "consumed",
        "runs",
        "suspected_lost",
        "doubled",
        "empty_runs",
        "out_of_order",
        "stale_queue_rows",
    ]
    expected = {n: plan.expected.get(n, 0) for n in names}
    results["mismatches"] = {n: (totals[n], expected[n]) for n in names if totals[n] != expected[n]}
    results["totals"] = {n: totals[n] for n in names}

    started = time.monotonic()
    cli = subprocess.run(
        [sys.executable, "-m", "airflow_dataset_race_fix", "audit", "--db-url", url, "--json"],
        capture_output=True,
        text=True,
    )
    results["cli_seconds"] = round(time.monotonic() - started, 2)
    results["cli_exit"] = cli.returncode
    if cli.returncode not in (0, 1):
        results["cli_error"] = cli.stderr.strip()[-500:]
    else:
        cli_totals = json.loads(cli.stdout)["totals"]
        results["cli_agrees"] = all(cli_totals[n] == totals[n] for n in names)
    return results


def run_backend(backend: str, args) -> dict:
    from reproduce.harness.database import ScratchDatabase, configure_airflow_env

    def log(message: str) -> None:
        print(f"[{backend}] {message}", file=sys.stderr, flush=True)

    database = ScratchDatabase(backend)
    url = database.create()
    home = tempfile.TemporaryDirectory(prefix="adrf-audit-large-home-")
    configure_airflow_env(url, home.name)
    try:
        from reproduce.harness.database import init_airflow_db

        started = time.monotonic()
        init_airflow_db()
        log(f"schema created in {time.monotonic() - started:.0f}s")
        plan = build_plan(args.events, args.runs, args.seed)
        log(f"plan: {len(plan.events):,} events, {len(plan.runs):,} runs, expected {plan.expected}")
        load(plan, create_dags(), backend, log)
        results = {"backend": backend, **time_audit(url, plan)}
        log(json.dumps(results))
        return results
    finally:
        if args.keep:
            if database._tmpdir is not None:  # SQLite: keep the temporary directory too
                database._tmpdir._finalizer.detach()
            log(f"kept: {url}")
        else:
            from airflow import settings

            settings.dispose_orm()
            database.drop()
        home.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("backends", nargs="+", choices=("sqlite", "postgres", "mysql"))
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the database(s) and print the URL")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # one backend per process: Airflow reads its configuration once
        print(json.dumps(run_backend(args.backends[0], args)))
        return 0
    summary = []
    for backend in args.backends:
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                backend,
                "--child",
                "--events",
                str(args.events),
                "--runs",
                str(args.runs),
                "--seed",
                str(args.seed),
            ]
            + (["--keep"] if args.keep else []),
            stdout=subprocess.PIPE,
            text=True,
        )
        summary.append(
            json.loads(child.stdout.strip().splitlines()[-1])
            if child.returncode == 0
            else {"backend": backend, "error": f"exit {child.returncode}"}
        )
    print(json.dumps(summary, indent=2))
    return 0 if all("error" not in s and not s.get("mismatches") for s in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
