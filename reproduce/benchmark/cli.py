"""The command line (``python reproduce/bench.py``): its options, and the cases run in their order."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from reproduce.benchmark.cases.busy_dataset import (
    BUSY_DATASET_ON_SQLITE,
    BUSY_DATASET_STATES,
    bench_busy_dataset,
)
from reproduce.benchmark.cases.busy_scheduler import bench_busy_producers
from reproduce.benchmark.cases.explain import bench_explain
from reproduce.benchmark.cases.fan_out import bench_fanout
from reproduce.benchmark.cases.first_run import bench_first_run
from reproduce.benchmark.cases.fleet import bench_fleet
from reproduce.benchmark.cases.late_restart import bench_late_after_restart
from reproduce.benchmark.cases.loop_cases import bench_loop_cases
from reproduce.benchmark.cases.loop_history import bench_loop
from reproduce.benchmark.cases.mixed_upgrade import bench_mixed_upgrade
from reproduce.benchmark.cases.producer import bench_producer
from reproduce.benchmark.cases.stalled_producer import STALLED_PRODUCER_SKIP, bench_stalled_producer
from reproduce.benchmark.cases.task_producer import bench_task_producer
from reproduce.benchmark.cases.upgrade_downtime import bench_upgrade_downtime
from reproduce.benchmark.cases.window_as_met import bench_window_as_met
from reproduce.benchmark.report import render, targets
from reproduce.benchmark.runner import Variants, log
from reproduce.benchmark.world import STATISTICS_STATES
from reproduce.harness.database import BACKENDS, DatabaseUnavailable, ScratchDatabase, configure_airflow_env

CASES = (
    "producer",
    "task-producer",
    "busy-scheduler",
    "loop-history",
    "loop-cases",
    "first-run",
    "window-as-met",
    "busy-dataset",
    "fleet",
    "fan-out",
    "late-restart",
    "stalled-producer",
    "explain",
    "mixed-upgrade",
    "upgrade-downtime",
)
# run only when named (--cases): the stop lasts --minutes (10 by default)
LONG_CASES = ("upgrade-downtime",)


def _case_names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    for name in names:
        if name not in CASES:
            raise argparse.ArgumentTypeError(f"unknown case {name!r}; choose from {', '.join(CASES)}")
    return names


def _positive(kind: type) -> Callable[[str], Any]:
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0: {text!r}")
        return value

    return parse


def _statistics_states(text: str) -> tuple[str, ...]:
    states = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(set(states) - set(STATISTICS_STATES))
    if unknown or not states:
        raise argparse.ArgumentTypeError(
            f"expected some of {', '.join(STATISTICS_STATES)}, comma-separated; got {text!r}"
        )
    return states


def _variant_names(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names or set(names) - {"stock", "fixed", "restart"}:
        raise argparse.ArgumentTypeError(f"expected names of stock, fixed, restart; got {text!r}")
    return names


def _positive_ints(text: str) -> tuple[int, ...]:
    return tuple(_positive(int)(part) for part in text.split(","))


def run_case(
    case: str, variants: Variants, args: argparse.Namespace, notes: list[str]
) -> tuple[list[dict], list[str]]:
    """Run ``case`` with its options from ``args``: its rows, and the query plans it took (``--explain``)."""
    if case == "producer":
        return bench_producer(variants, tuple(int(x) for x in args.fanouts.split(",")), args.samples), []
    if case == "task-producer":
        return bench_task_producer(variants, max(30, args.samples)), []
    if case == "busy-scheduler":
        return bench_busy_producers(variants, args.busy_rounds), []
    if case == "loop-history":
        return bench_loop(
            variants, tuple(int(x) for x in args.sizes.split(",")), args.loop_samples, args.explain
        )
    if case == "loop-cases":
        windows = tuple(int(x) for x in args.windows.split(",") if x)
        return bench_loop_cases(variants, windows, args.ready, args.case_samples), []
    if case == "first-run":
        return bench_first_run(variants, args.first_run, args.first_run_samples), []
    if case == "window-as-met":
        windows = tuple(int(x) for x in args.windows.split(",") if x)
        return bench_window_as_met(
            variants, windows, args.case_samples * 2, notes, args.window_loops, args.window_statistics
        ), []
    if case == "busy-dataset":
        rows = bench_busy_dataset(
            variants,
            args.busy_dataset_rates,
            args.busy_dataset_rounds,
            args.busy_dataset_seconds,
            args.busy_dataset_history,
            notes,
            states=args.busy_dataset_statistics,
        )
        if args.backend == "sqlite":
            notes.append(BUSY_DATASET_ON_SQLITE)
        return rows, []
    if case == "fleet":
        return bench_fleet(
            variants,
            args.fleet_dags,
            args.fleet_rate,
            args.fleet_rounds,
            args.fleet_seconds,
            args.seed,
            notes,
        ), []
    if case == "fan-out":
        return bench_fanout(
            variants, *args.fanout[:3], args.fanout_loops, notes, args.fanout_pass_seconds, args.fanout_pace
        ), []
    if case == "late-restart":
        bench_late_after_restart(variants, args.late_events, notes, args.fanout_pass_seconds)
        return [], []
    if case == "mixed-upgrade":
        bench_mixed_upgrade(variants, args.mixed_rounds, notes)
        return [], []
    if case == "upgrade-downtime":
        consumers, pairs = args.upgrade_fanout
        for variant in args.upgrade_variants:
            bench_upgrade_downtime(
                variants,
                consumers,
                pairs,
                args.minutes,
                args.upgrade_rate,
                args.upgrade_late,
                args.upgrade_history,
                args.seed,
                notes,
                args.fanout_pass_seconds,
                args.upgrade_after,
                variant,
            )
        return [], []
    if case == "explain":
        variants.use("fixed")
        bench_explain(notes, args.explain_events)
        variants.use("stock")
        return [], []
    if args.backend == "sqlite":  # stalled-producer
        notes.append(STALLED_PRODUCER_SKIP)
        return [], []
    return bench_stalled_producer(variants, args.stall_seconds, args.stall_rounds), []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.py", description="fixed vs stock cost, side by side")
    parser.add_argument("--backend", choices=BACKENDS, default="sqlite")
    parser.add_argument(
        "--db-url", metavar="URL", help="server URL (a scratch database is created and dropped)"
    )
    parser.add_argument(
        "--cases",
        type=_case_names,
        default=[case for case in CASES if case not in LONG_CASES],
        metavar="NAMES",
        help=f"cases to run, comma-separated, of {', '.join(CASES)} (default: all but {LONG_CASES[0]})",
    )
    parser.add_argument(
        "--skip", type=_case_names, default=[], metavar="NAMES", help="comma-separated cases not to run"
    )
    parser.add_argument(
        "--samples", type=int, default=40, help="producer samples per variant (default %(default)s)"
    )
    parser.add_argument("--loop-samples", type=int, default=15, help="scheduler loop samples per variant")
    parser.add_argument(
        "--busy-rounds",
        type=int,
        default=6,
        help="rounds per variant of producers beside a busy scheduler (default %(default)s)",
    )
    parser.add_argument(
        "--windows",
        default="50000,200000",
        help="consumed events inside the look-back window (default %(default)s)",
    )
    parser.add_argument("--ready", type=int, default=200, help="ready DAGs in one loop (default %(default)s)")
    parser.add_argument(
        "--first-run",
        type=_positive_ints,
        default=(50_000, 200_000),
        metavar="SIZES",
        help="first run: events before a DAG's first run, a sub-case each (default 50000,200000)",
    )
    parser.add_argument(
        "--first-run-samples",
        type=_positive(int),
        default=1,
        metavar="N",
        help="first run: loops per variant and size (default %(default)s; stock's take minutes)",
    )
    parser.add_argument(
        "--case-samples",
        type=int,
        default=5,
        help="samples per variant of the window and ready-DAG cases (default %(default)s)",
    )
    parser.add_argument("--sizes", default="1000,100000", help="historical events (default %(default)s)")
    parser.add_argument("--fanouts", default="1,10,50", help="consuming DAGs (default %(default)s)")
    parser.add_argument(
        "--busy-dataset-rates",
        type=_positive_ints,
        default=(50, 200),
        metavar="RATES",
        help="busy dataset: events/s of all producers together, one sub-case each (default 50,200)",
    )
    parser.add_argument(
        "--busy-dataset-seconds",
        type=_positive(float),
        default=5.0,
        metavar="S",
        help="busy dataset: seconds per round (default %(default)s)",
    )
    parser.add_argument(
        "--busy-dataset-rounds",
        type=_positive(int),
        default=4,
        metavar="N",
        help="busy dataset: rounds per variant and rate (default %(default)s)",
    )
    parser.add_argument(
        "--busy-dataset-history",
        type=_positive(int),
        default=50_000,
        metavar="EVENTS",
        help="busy dataset: consumed events of the last ten minutes at its start (default %(default)s)",
    )
    parser.add_argument(
        "--window-statistics",
        type=_statistics_states,
        default=STATISTICS_STATES,
        metavar="STATES",
        help="window as met: statistics states, comma-separated (default: never analyzed,behind,fresh; "
        "never analyzed only while no earlier case took statistics)",
    )
    parser.add_argument(
        "--window-loops",
        type=_positive(int),
        default=4,
        metavar="N",
        help="window as met: loops per new scheduler runner, the first one included (default %(default)s)",
    )
    parser.add_argument(
        "--busy-dataset-statistics",
        type=_statistics_states,
        default=BUSY_DATASET_STATES,
        metavar="STATES",
        help="busy dataset: the planner's statistics taken before the history's "
        "load, after it, or each in turn: behind, fresh or behind,fresh (default behind,fresh); or "
        "never analyzed (its first rate only, with --cases busy-dataset alone)",
    )
    parser.add_argument(
        "--fleet-dags",
        type=_positive(int),
        default=600,
        metavar="N",
        help="fleet: dataset-triggered DAGs per variant (default %(default)s)",
    )
    parser.add_argument(
        "--fleet-rate",
        type=_positive(int),
        default=20,
        metavar="N",
        help="fleet: producer transactions a second, each with 1-3 outlets (default %(default)s)",
    )
    parser.add_argument(
        "--fleet-rounds",
        type=_positive(int),
        default=2,
        metavar="N",
        help="fleet: rounds per variant (default %(default)s)",
    )
    parser.add_argument(
        "--fleet-seconds",
        type=_positive(float),
        default=12.0,
        metavar="S",
        help="fleet: seconds per round, past one sweep interval (default %(default)s)",
    )
    parser.add_argument(
        "--fanout",
        type=_positive_ints,
        default=(100, 3, 10_000),
        metavar="C,D,E",
        help="fan-out: consumers per dataset, datasets, events per dataset (default 100,3,10000)",
    )
    parser.add_argument(
        "--fanout-loops",
        type=_positive(int),
        default=100,
        metavar="N",
        help="fan-out: loops per variant just started, and twice as many long-running (default %(default)s)",
    )
    parser.add_argument(
        "--fanout-pass-seconds",
        type=_positive(float),
        default=900.0,
        metavar="S",
        help="fan-out: longest wait for the net to catch up after a start, its rest then skipped "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--fanout-pace",
        type=float,
        default=0.0,
        metavar="S",
        help="fan-out: seconds from the start of one pair of loops to the next, as a scheduler with nothing "
        "to do sleeps (1: a loop a second; default 0: back to back)",
    )
    parser.add_argument(
        "--late-events",
        type=_positive_ints,
        default=(100_000,),
        metavar="SIZES",
        help="late after a restart: events in the busy DAGs' windows, a sub-case each "
        "(default 100000; 1000000 takes minutes to write)",
    )
    parser.add_argument(
        "--seed", type=int, default=30, help="fleet: the producers' random seed (default %(default)s)"
    )
    parser.add_argument(
        "--stall-seconds",
        type=_positive(float),
        default=5.0,
        metavar="S",
        help="stalled producer: how long producer A holds its transaction open (default %(default)s)",
    )
    parser.add_argument(
        "--stall-rounds",
        type=_positive(int),
        default=2,
        metavar="N",
        help="stalled producer: rounds per variant (default %(default)s)",
    )
    parser.add_argument(
        "--mixed-rounds",
        type=_positive(int),
        default=1,
        metavar="N",
        help="mixed upgrade: rounds of the three states (default %(default)s)",
    )
    parser.add_argument(
        "--minutes",
        type=_positive(float),
        default=10.0,
        metavar="M",
        help="upgrade downtime: minutes every scheduler stops, producers committing (default %(default)s)",
    )
    parser.add_argument(
        "--upgrade-fanout",
        type=_positive_ints,
        default=(100, 3),
        metavar="C,P",
        help="upgrade downtime: consumers a dataset pair (each on x | y), pairs (default 100,3: 300 DAGs)",
    )
    parser.add_argument(
        "--upgrade-rate",
        type=_positive(float),
        default=10.0,
        metavar="N",
        help="upgrade downtime: producer transactions a second, an outlet each (default %(default)s)",
    )
    parser.add_argument(
        "--upgrade-late",
        type=_positive(int),
        default=6,
        metavar="N",
        help="upgrade downtime: producers stamped before the last stock runs, committing in the stop (6)",
    )
    parser.add_argument(
        "--upgrade-after",
        type=float,
        default=30.0,
        metavar="S",
        help="upgrade downtime: seconds the producers go on after the scheduler starts (default %(default)s)",
    )
    parser.add_argument(
        "--upgrade-variants",
        type=_variant_names,
        default=("fixed",),
        metavar="NAMES",
        help="upgrade downtime: fixed (the procedure from stock), restart (the fix's before the stop too), "
        "stock (a stock restart); comma-separated (default fixed)",
    )
    parser.add_argument(
        "--upgrade-history",
        type=int,
        default=1000,
        metavar="EVENTS",
        help="upgrade downtime: consumed events of each x dataset before the case (default %(default)s)",
    )
    parser.add_argument("--explain", action="store_true", help="print the query plans of the event selection")
    parser.add_argument(
        "--explain-events",
        type=_positive(int),
        default=200_000,
        metavar="EVENTS",
        help="events (consumed, 10 a run) of the DAG the explain case explains (default %(default)s)",
    )
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    cases = [case for case in CASES if case in args.cases and case not in args.skip]
    if not cases:
        parser.error("--cases and --skip leave no case to run")
    from reproduce.runner import ReproduceError, check_airflow_version

    try:
        version = check_airflow_version()
    except ReproduceError as err:
        print(f"bench: error: {err}", file=sys.stderr)
        return 2
    database = ScratchDatabase(args.backend, server=args.db_url)
    try:
        database.create()
    except (DatabaseUnavailable, ImportError) as err:  # server down, or its driver not installed
        print(f"bench: error: {err}", file=sys.stderr)
        return 2
    home = tempfile.TemporaryDirectory(prefix="adrf-bench-home-")
    try:
        configure_airflow_env(database.url, home.name)
        from reproduce.harness.database import init_airflow_db

        log(f"bench on {args.backend}, Airflow {version}, database {database.name}")
        init_airflow_db()
        variants = Variants()
        rows, plans, notes = [], [], []
        for case in cases:
            started = time.monotonic()
            log(f"case {case}")
            case_rows, case_plans = run_case(case, variants, args, notes)
            rows += case_rows
            plans += case_plans
            log(f"case {case}: {time.monotonic() - started:.0f} s")
        print(render(args.backend, rows, tuple(notes)))
        for plan in plans:
            print(plan)
        if args.json:
            with open(args.json, "w") as handle:
                json.dump(
                    {
                        "backend": args.backend,
                        "airflow_version": version,
                        "rows": rows,
                        "targets": targets(args.backend, rows),
                        "notes": notes,
                        "plans": plans,
                    },
                    handle,
                    indent=2,
                )
    finally:
        from airflow import settings

        settings.dispose_orm()
        database.drop()
        home.cleanup()
    return 0
