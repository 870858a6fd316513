"""
What a producer task costs where this package is installed and the fix is off, against a host without
the package and one with the fix on: ``python -m reproduce.producer_cost --backend postgres --processes 8``
(from the clone, in a tox env's Python; ``--backend`` sqlite, postgres or mysql).

One scratch database; a DAG whose task has a dataset outlet (one consumer DAG on it). Each sample is
a fresh Python process that runs that task once through ``TaskInstance._run_raw_task`` (a run of its
own), as an executor's task process does; the variants alternate sample by sample:

- ``stock``: the same virtualenv with this package's ``airflow.plugins`` entry points left out of
  Airflow's scan (no plugin, no listener, no mark) and no shim: a host without the package;
- ``disabled``: the shim's route on (PYTHONPATH) and ``AIRFLOW_DATASET_RACE_FIX_DISABLED=1``, the
  documented rollback; ``not-activated``: installed, no route turned on;
- ``on``: the PYTHONPATH route, the fix in place.

Each process prints the time of ``_run_raw_task`` (the task's run, listeners and marks included), the
CPU time of this process in it (less moved by a busy machine), the whole process's time, and, where
the package is installed, the time spent in its listener's hooks (announcing the verdict, the producer
mark); the medians and their ratios to ``stock`` are printed as a table. ``--instructions``: each process
runs under ``valgrind --tool=callgrind`` too, and the instructions it executed (the whole process, this
package's imports and hooks included; the database server's work not) are printed as ratios to ``stock``:
a count that a busy machine does not move, where a few per cent of wall time are lost in its noise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("stock", "disabled", "not-activated", "on")

DAG = """
import pendulum
from airflow import DAG
from airflow.datasets import Dataset
from airflow.operators.empty import EmptyOperator
from airflow.operators.python import PythonOperator

DATASET = Dataset("adrf://producer-cost/d")
with DAG("adrf_cost_producer", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), schedule=None):
    PythonOperator(task_id="emit", python_callable=lambda: None, outlets=[DATASET])
with DAG("adrf_cost_consumer", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), schedule=[DATASET]):
    EmptyOperator(task_id="noop")
"""

# A host without this package: Airflow's scan of the installed distributions' entry points as ever, ours left
# out.
HIDE_PACKAGE = """
import airflow.utils.entry_points as entry_points
grouped = entry_points.entry_points_with_dist
def without_ours(group):
    return (pair for pair in grouped(group) if not pair[0].value.startswith("airflow_dataset_race_fix"))
entry_points.entry_points_with_dist = without_ours
import airflow.plugins_manager as plugins_manager
plugins_manager.entry_points_with_dist = without_ours
"""

# Where the package is installed: the time spent in its listener's hooks, summed (the plugin's own share).
TIME_HOOKS = """
import functools, time
from airflow_dataset_race_fix.web import plugin as ours
spent = [0.0]
def timed(hook):
    @functools.wraps(hook)
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return hook(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - started
    return wrapper
ours.on_starting = timed(ours.on_starting)
ours.on_task_instance_running = timed(ours.on_task_instance_running)
"""

RUN_TASK = """
import json, sys, time
spent = globals().get("spent", [0.0])
from airflow.models.dagbag import DagBag
from airflow.models.taskinstance import TaskInstance
dag = DagBag(sys.argv[1], include_examples=False).get_dag("adrf_cost_producer")
ti = TaskInstance(dag.get_task("emit"), run_id=sys.argv[2])
ti.refresh_from_db()
started, cpu = time.perf_counter(), time.process_time()
ti._run_raw_task()
took, cpu = time.perf_counter() - started, time.process_time() - cpu
assert ti.state == "success", ti.state
found = {"task_ms": took * 1000, "cpu_ms": cpu * 1000, "hooks_ms": spent[0] * 1000}
print("RESULT " + json.dumps(found), flush=True)
"""


def _child_env(variant: str, dags: str) -> dict[str, str]:
    from airflow_dataset_race_fix import BOOTSTRAP_DIR
    from airflow_dataset_race_fix.bootstrap import SWITCHES

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and k not in SWITCHES}
    env["AIRFLOW__CORE__DAGS_FOLDER"] = dags
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, REPO] if variant in ("disabled", "on") else [REPO])
    if variant == "disabled":
        env["AIRFLOW_DATASET_RACE_FIX_DISABLED"] = "1"
    return env


# Under callgrind a DAG file's import takes longer than Airflow's 30 s default: the same for every variant.
SLOW_IMPORTS = {"AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "3600"}


def _sample(variant: str, dags: str, run_id: str, instructions: bool) -> tuple[float, ...]:
    code = (HIDE_PACKAGE if variant == "stock" else TIME_HOOKS) + RUN_TASK
    counted = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"] if instructions else []
    started = time.perf_counter()
    proc = subprocess.run(
        [*counted, sys.executable, "-c", textwrap.dedent(code), dags, run_id],
        env={**_child_env(variant, dags), "PYTHONHASHSEED": "0", **(SLOW_IMPORTS if instructions else {})},
        capture_output=True,
        text=True,
        timeout=3600 if instructions else 300,
    )
    wall = (time.perf_counter() - started) * 1000
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        raise SystemExit(f"{variant} sample failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    found = json.loads(line[len("RESULT ") :])
    collected = [x for x in proc.stderr.splitlines() if "Collected :" in x]  # callgrind's total
    executed = int(collected[-1].rsplit(":", 1)[1]) if collected else 0
    return found["task_ms"], found["cpu_ms"], wall, found["hooks_ms"], executed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "mysql"), default="sqlite")
    parser.add_argument("--processes", type=int, default=8, help="samples a variant (and a warm-up each)")
    parser.add_argument(
        "--instructions", action="store_true", help="each process under callgrind: instructions executed"
    )
    args = parser.parse_args(argv)

    from reproduce.harness.database import ScratchDatabase, configure_airflow_env, init_airflow_db

    database = ScratchDatabase(args.backend)
    database.create()
    home = tempfile.TemporaryDirectory(prefix="adrf-producer-cost-")
    try:
        configure_airflow_env(database.url, home.name)
        dags = os.path.join(home.name, "dags")
        with open(os.path.join(dags, "adrf_cost.py"), "w") as dag_file:
            dag_file.write(textwrap.dedent(DAG))
        init_airflow_db()
        import pendulum
        from airflow.models.dagbag import DagBag
        from airflow.utils.session import create_session
        from airflow.utils.state import DagRunState
        from airflow.utils.types import DagRunType

        bag = DagBag(dags, include_examples=False)
        bag.sync_to_db()
        producer = bag.dags["adrf_cost_producer"]
        samples: dict[str, list[tuple[float, ...]]] = {v: [] for v in VARIANTS}
        for index in range(args.processes + 1):  # the first round warms the disk cache and writes the marks
            order = VARIANTS if index % 2 else VARIANTS[::-1]
            for variant in order:
                run_id = f"cost_{index}_{variant}"
                minute = len(VARIANTS) * index + VARIANTS.index(variant)
                logical_date = pendulum.datetime(2026, 2, 1, tz="UTC").add(minutes=minute)
                with create_session() as session:
                    producer.create_dagrun(
                        run_id=run_id,
                        state=DagRunState.RUNNING,
                        session=session,
                        execution_date=logical_date,
                        run_type=DagRunType.MANUAL,
                        data_interval=(logical_date, logical_date),
                    )
                sample = _sample(variant, dags, run_id, args.instructions)
                if index:
                    samples[variant].append(sample)
        stock = [statistics.median(sample[i] for sample in samples["stock"]) for i in range(3)]
        print(f"{args.backend}, {args.processes} fresh processes a variant, alternating:")
        print(
            "| variant | _run_raw_task ms | / stock | its CPU ms | / stock | whole process ms | / stock "
            "| in our hooks ms |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for variant in VARIANTS:
            medians = [statistics.median(sample[i] for sample in samples[variant]) for i in range(4)]
            print(
                f"| {variant} | "
                + " | ".join(f"{m:.1f} | {m / s:.3f}" for m, s in zip(medians, stock))
                + f" | {medians[3]:.2f} |"
            )
        if args.instructions:
            counts = {v: statistics.median(sample[4] for sample in samples[v]) for v in VARIANTS}
            print("\n| variant | instructions executed (callgrind), whole process | / stock |\n|---|---|---|")
            for variant in VARIANTS:
                print(f"| {variant} | {counts[variant]:,.0f} | {counts[variant] / counts['stock']:.4f} |")
    finally:
        from airflow import settings

        settings.dispose_orm()
        database.drop()
        home.cleanup()


if __name__ == "__main__":
    main()
