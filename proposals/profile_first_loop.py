"""
Where a fixed scheduler's first loop over a busy window spends its time (PostgreSQL):
bench.py's window-as-met case (one DAG, N consumed events in its last ten minutes, one new
event), a new runner per sample, stock and fixed alternating; each statement timed at the
cursor (before/after_cursor_execute) with its server process's CPU (/proc/<pid>/schedstat:
run as the server's user or root, the server on this host), the fix's steps by this
thread's CPU; --explain: EXPLAIN ANALYZE of the last sample's statements; --alternatives:
the net's first look as it is and as proposals/firstloop.diff proposes.

    .tox/airflow2104-postgres/bin/python proposals/profile_first_loop.py --events 200000 --samples 4
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from datetime import datetime, timedelta, timezone

sys.path.insert(0, ".")

from reproduce import bench  # noqa: E402
from reproduce.harness.database import ScratchDatabase, configure_airflow_env  # noqa: E402

STEPS = (
    "_dags_with_unqueued_dataset_events", "_dags_with_stranded_dataset_events", "_follow_dataset_event_ids",
    "_read_dataset_windows_once", "_dags_with_new_unqueued_events", "_runnable_dataset_dags",
    "_create_dag_runs_dataset_triggered", "_decide_dataset_triggered_runs", "_read_dataset_decision_state",
    "_create_dag_runs", "_events_for_timetable", "_choose_dataset_run", "_dataset_floors",
    "_remember_dataset_reads", "_checked_dataset_floors", "_link_consumed_events",
    "_delete_dataset_queue_rows_as_read", "_runs_and_datasets_statement", "_events_not_consumed_statement",
)


class Recorder:
    def __init__(self) -> None:
        self.on = False
        self.statements: list[tuple[str, str, float]] = []  # (caller, sql, seconds)
        self.explain: set[str] = set()  # callers whose statements are explained (once each) after they ran
        self.plans: list[str] = []
        self.builds: dict[str, float] = defaultdict(float)
        self.server_cpu = 0.0
        self.client_cpu_in_statements = 0.0
        self.steps: dict[str, float] = defaultdict(float)
        self._started: dict[int, float] = {}

    @staticmethod
    def backend_cpu(cursor) -> float:
        """The connection's server process's CPU seconds so far (/proc schedstat: nanoseconds on a CPU)."""
        pid = cursor.connection.info.backend_pid
        with open(f"/proc/{pid}/schedstat") as handle:
            return int(handle.read().split()[0]) / 1e9

    def before(self, conn, cursor, statement, parameters, context, executemany):
        if self.on:
            self._started[id(cursor)] = time.perf_counter()
            self._cpu_started = (self.backend_cpu(cursor), time.thread_time())

    def after(self, conn, cursor, statement, parameters, context, executemany):
        if not self.on or id(cursor) not in self._started:
            return
        took = time.perf_counter() - self._started.pop(id(cursor))
        server_cpu = self.backend_cpu(cursor) - self._cpu_started[0]
        self.server_cpu += server_cpu
        self.client_cpu_in_statements += time.thread_time() - self._cpu_started[1]
        caller = "?"
        for frame in reversed(traceback.extract_stack(limit=40)):
            if "airflow_dataset_race_fix" in frame.filename or "scheduler_job_runner" in frame.filename \
                    or "models/dag.py" in frame.filename or "models/dagrun.py" in frame.filename:
                caller = f"{frame.filename.rsplit('/', 2)[-1]}:{frame.name}:{frame.lineno}"
                break
        self.statements.append((caller, " ".join(statement.split()), took, server_cpu))
        name = caller.split(":")[1] if ":" in caller else caller
        if name in self.explain and conn.dialect.name == "postgresql" and not executemany:
            self.on = False
            explain = cursor.connection.cursor()  # not the statement's own: its rows are still to be read
            try:
                explain.execute("SAVEPOINT explained")
                if statement.startswith("INSERT INTO dagrun_dataset_event"):  # the same rows again
                    explain.execute("DELETE FROM dagrun_dataset_event WHERE dag_run_id = "
                                    + statement.split("VALUES (", 1)[1].split(",", 1)[0])
                explain.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, parameters)
                plan = "\n".join(row[0] for row in explain.fetchall())
                explain.execute("ROLLBACK TO SAVEPOINT explained")
                query = explain.query.decode()[:3000]
                self.plans.append(f"--- {caller}: {took * 1000:.2f} ms as run\n{query}\n{plan}")
            finally:
                explain.close()
                self.on = True


def wrap_steps(recorder: Recorder) -> list[tuple[type, str, object]]:
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner

    undo = []
    for name in STEPS:
        original = SchedulerJobRunner.__dict__.get(name)
        if original is None:
            continue
        func = original.__func__ if isinstance(original, (staticmethod, classmethod)) else original

        def timed(*args, __func=func, __name=name, **kwargs):
            started = time.thread_time()  # this thread's CPU: robust to the load of a shared machine
            try:
                return __func(*args, **kwargs)
            finally:
                recorder.steps[__name] += time.thread_time() - started

        wrapped = staticmethod(timed) if isinstance(original, staticmethod) else \
            classmethod(timed) if isinstance(original, classmethod) else timed
        setattr(SchedulerJobRunner, name, wrapped)
        undo.append((SchedulerJobRunner, name, original))
    original = SchedulerJobRunner.__dict__.get("_dataset_statement")
    if original is not None:
        def statement(self, key, build, __original=original):
            def timed_build():
                started = time.thread_time()
                try:
                    return build()
                finally:
                    recorder.builds[str(key)] += time.thread_time() - started
            return __original(self, key, timed_build)

        setattr(SchedulerJobRunner, "_dataset_statement", statement)
        undo.append((SchedulerJobRunner, "_dataset_statement", original))
    return undo


FIRST_LOOKS = {
    "as is: max(id), then counted by the thousand over 10 000 ids (2 statements)": (
        "SELECT max(id) FROM dataset_event",
        "SELECT id - id % 1000 AS bucket, count(*), min(id) FROM dataset_event "
        "WHERE id BETWEEN {high} - 9999 AND {high} GROUP BY bucket",
    ),
    "proposed: max(id), count(*) and min(id) of the last 10 000 ids (1 statement)": (
        "SELECT h.high, count(e.id), min(e.id) FROM (SELECT max(id) AS high FROM dataset_event) h "
        "LEFT JOIN dataset_event e ON e.id BETWEEN h.high - 9999 AND h.high GROUP BY h.high",
    ),
    "proposed, 2 000 ids (1 statement)": (
        "SELECT h.high, count(e.id), min(e.id) FROM (SELECT max(id) AS high FROM dataset_event) h "
        "LEFT JOIN dataset_event e ON e.id BETWEEN h.high - 1999 AND h.high GROUP BY h.high",
    ),
}


def first_looks(state: str, runs: int = 20) -> None:
    """Each way of the net's first look, ``runs`` times: the server's CPU and the wall time, medians."""
    from airflow import settings

    print(f"\n=== the net's first look, {state}: server CPU and wall, median of {runs} ===")
    raw = settings.engine.raw_connection()
    try:
        cursor = raw.cursor()
        pid = (getattr(raw, "dbapi_connection", None) or raw.connection).info.backend_pid
        for label, statements in FIRST_LOOKS.items():
            cpu, wall = [], []
            for _ in range(runs):
                with open(f"/proc/{pid}/schedstat") as handle:
                    before = int(handle.read().split()[0])
                started = time.perf_counter()
                high = None
                for statement in statements:
                    cursor.execute(statement.format(high=high))
                    rows = cursor.fetchall()
                    high = rows[0][0]
                wall.append(time.perf_counter() - started)
                with open(f"/proc/{pid}/schedstat") as handle:
                    cpu.append((int(handle.read().split()[0]) - before) / 1e9)
            print(f"  {statistics.median(cpu) * 1000:6.2f} ms server CPU, "
                  f"{statistics.median(wall) * 1000:6.2f} ms wall  {label}")
        raw.rollback()
    finally:
        raw.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--states", default="never analyzed,fresh")
    parser.add_argument("--cprofile", action="store_true", help="profile one more fixed first loop")
    parser.add_argument("--explain", action="store_true", help="EXPLAIN ANALYZE the last sample's statements")
    parser.add_argument("--alternatives", action="store_true",
                        help="time the net's first look as it is and as proposed (server CPU, 20 runs each)")
    args = parser.parse_args()
    database = ScratchDatabase("postgres")
    database.create()
    home = tempfile.TemporaryDirectory(prefix="adrf-prof-home-")
    try:
        configure_airflow_env(database.url, home.name)
        from reproduce.harness.database import init_airflow_db

        init_airflow_db()
        from airflow import settings
        from airflow.datasets import Dataset
        from airflow.datasets.manager import dataset_manager
        from airflow.models.dataset import DatasetModel
        from sqlalchemy import event, select

        variants = bench.Variants()
        recorder = Recorder()
        event.listen(settings.engine, "before_cursor_execute", recorder.before)
        event.listen(settings.engine, "after_cursor_execute", recorder.after)

        dataset = Dataset(f"bench://prof/{args.events}")
        (dag_id,) = bench.make_consumers(f"prof_{args.events}", {"single_a": [dataset]})
        with settings.Session() as session:
            dataset_id = session.scalar(select(DatasetModel.id).where(DatasetModel.uri == dataset.uri))
        end = datetime.now(timezone.utc) - timedelta(seconds=30)
        size = args.events
        instants = [end - timedelta(minutes=10) * (size - i) / size for i in range(size)]
        loaded = time.monotonic()
        bench.add_history({"single_a": dag_id}, {"a": dataset_id}, instants, 0, watches={"single_a": {"a"}})
        print(f"loaded {size} events in {time.monotonic() - loaded:.0f} s", flush=True)
        bench.quiet_other_dags([dag_id])
        variants.use("stock")
        with settings.Session() as session:
            dataset_manager.register_dataset_change(dataset=dataset, session=session)
            session.commit()

        class _NoCommit:
            def __init__(self, session) -> None:
                self.session = session

            def commit(self) -> None:
                self.session.flush()

        def one_loop(runner) -> float:
            session = settings.Session.session_factory()
            try:
                started = time.perf_counter()
                runner._create_dagruns_for_dags(guard=_NoCommit(session), session=session)
                return time.perf_counter() - started
            finally:
                session.rollback()
                session.close()

        for state in args.states.split(","):
            if state == "fresh":
                bench.analyze()
            totals = {v: [] for v in bench.VARIANTS}
            afters = {v: [] for v in bench.VARIANTS}
            by_stmt = {v: defaultdict(list) for v in bench.VARIANTS}
            by_step = {v: defaultdict(list) for v in bench.VARIANTS}
            cpus = {v: [] for v in bench.VARIANTS}
            for i in range(args.samples + args.explain):
                for variant in bench.VARIANTS if i % 2 == 0 else bench.VARIANTS[::-1]:
                    variants.use(variant)
                    undo = wrap_steps(recorder)
                    runner = bench.new_scheduler_runner()
                    gc.collect()
                    recorder.statements.clear()
                    recorder.steps.clear()
                    recorder.builds.clear()
                    recorder.server_cpu = recorder.client_cpu_in_statements = 0.0
                    if i == args.samples:  # one more, explained, not counted
                        recorder.explain = {
                            "_follow_dataset_event_ids", "_read_dataset_decision_state",
                            "_decide_dataset_triggered_runs", "_link_consumed_events",
                            "_delete_dataset_queue_rows_as_read", "_create_dag_runs_dataset_triggered",
                        }
                    recorder.on = True
                    cpu = time.thread_time()
                    totals[variant].append(one_loop(runner))
                    cpu = time.thread_time() - cpu
                    recorder.on = False
                    recorder.explain = set()
                    if i == args.samples:
                        totals[variant].pop()
                        for owner, name, original in undo:
                            setattr(owner, name, original)
                        continue
                    in_sql = sum(row[2] for row in recorder.statements)
                    cpus[variant].append((cpu, recorder.server_cpu))
                    print(f"  {state} {variant} sample {i}: loop {totals[variant][-1] * 1000:.1f} ms, "
                          f"{len(recorder.statements)} statements {in_sql * 1000:.1f} ms, "
                          f"python CPU {cpu * 1000:.1f} ms "
                          f"(in statements {recorder.client_cpu_in_statements * 1000:.1f}), "
                          f"server CPU {recorder.server_cpu * 1000:.1f} ms, "
                          f"statement builds {sum(recorder.builds.values()) * 1000:.1f} ms "
                          f"{ {k: round(v * 1000, 2) for k, v in recorder.builds.items()} }", flush=True)
                    per = defaultdict(float)
                    for caller, sql, took, server in recorder.statements:
                        per[(caller, sql[:160])] += server
                    for key, took in per.items():
                        by_stmt[variant][key].append(took)
                    for key, took in recorder.steps.items():
                        by_step[variant][key].append(took)
                    afters[variant].append(one_loop(runner))
                    for owner, name, original in undo:
                        setattr(owner, name, original)
            variants.use("stock")
            print(f"\n=== {state}, {size} events, {args.samples} samples a variant ===")
            for variant in bench.VARIANTS:
                ms = [round(t * 1000, 1) for t in totals[variant]]
                python_cpu = statistics.median(c for c, _ in cpus[variant])
                server_cpu = statistics.median(c for _, c in cpus[variant])
                print(f"{variant}: python CPU median {python_cpu * 1000:.1f} ms, "
                      f"server CPU median {server_cpu * 1000:.1f} ms")
                print(f"{variant}: first loops ms {ms} median {statistics.median(ms):.1f}; "
                      f"second loop median {statistics.median(afters[variant]) * 1000:.1f}")
            for variant in bench.VARIANTS:
                print(f"-- {variant}: steps, python CPU (median ms over samples)")
                for key, values in sorted(by_step[variant].items(), key=lambda kv: -statistics.median(kv[1])):
                    each = [round(v * 1000, 1) for v in values]
                    print(f"   {statistics.median(values) * 1000:8.2f}  {key}  {each}")
                print(f"-- {variant}: statements by server CPU (median ms, samples)")
                rows = sorted(by_stmt[variant].items(), key=lambda kv: -statistics.median(kv[1]))
                for (caller, sql), values in rows[:14]:
                    print(f"   {statistics.median(values) * 1000:8.2f}  {caller}\n             {sql}")
            for plan in recorder.plans:
                print(plan)
            recorder.plans.clear()
            if args.alternatives:
                first_looks(state)
        if args.cprofile:
            import cProfile
            import pstats

            variants.use("fixed")
            runner = bench.new_scheduler_runner()
            profiler = cProfile.Profile()
            profiler.enable()
            one_loop(runner)
            profiler.disable()
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(45)
            variants.use("stock")
    finally:
        if "airflow.settings" in sys.modules:
            sys.modules["airflow.settings"].dispose_orm()
        database.drop()
        home.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
