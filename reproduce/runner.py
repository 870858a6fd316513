"""
The parent side of ``reproduce``: options, scratch databases, one child interpreter per
variant (stock, then fixed), the table and the exit code.

The parent imports nothing from Airflow, so that stock and fixed code never meet in
one interpreter and a wrong Airflow version is reported before anything starts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from reproduce import lab_command, report, requirements
from reproduce.harness import catalog
from reproduce.harness.database import BACKENDS, DatabaseExists, DatabaseUnavailable, ScratchDatabase

VARIANTS = ("stock", "fixed")
DEFAULT_SEED = 20261130
URL_SCHEMES = {"postgresql": "postgres", "postgres": "postgres", "mysql": "mysql", "mariadb": "mysql"}


class ReproduceError(Exception):
    """A clear, one-line reason to stop (bad input, database unreachable, wrong Airflow)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend", choices=BACKENDS, help="metadata database (default: sqlite, or the --db-url's)"
    )
    parser.add_argument(
        "--db-url",
        metavar="URL",
        help="SQLAlchemy URL of a PostgreSQL or MySQL/MariaDB server; a scratch database is created "
        "on it and dropped afterwards (default: ADRF_POSTGRES_URL / ADRF_MYSQL_URL or loopback)",
    )
    parser.add_argument(
        "--database",
        metavar="NAME",
        help="on a server: the scratch database's name (default adrf_<random>), created for each variant in "
        "turn and dropped after it; a database of that name that exists is refused, never used or dropped",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--stress", action="store_true", help="random concurrent producers and scheduler loops")
    mode.add_argument(
        "--e2e", action="store_true", help="a real 'airflow scheduler' running producer/consumer DAGs"
    )
    parser.add_argument(
        "--seed", type=int, default=DEFAULT_SEED, help="seed for --stress and --e2e (default %(default)s)"
    )
    parser.add_argument(
        "--repeat", type=int, default=1, metavar="N", help="runs per variant for --stress and --e2e"
    )
    parser.add_argument(
        "--only", metavar="IDS", help="deterministic: comma-separated scenario ids (e.g. S1,S6)"
    )
    parser.add_argument(
        "--producers", type=int, default=8, help="--stress: producer processes (default %(default)s)"
    )
    parser.add_argument(
        "--events", type=int, default=50, help="--stress: events per producer (default %(default)s)"
    )
    parser.add_argument(
        "--schedulers",
        type=int,
        choices=(1, 2),
        help="--stress: scheduler loops; --e2e --executor celery: 'airflow scheduler' processes "
        "(default 2 on postgres, 1 elsewhere)",
    )
    parser.add_argument(
        "--mapped", type=int, default=30, help="--e2e: mapped producer tasks per run (default %(default)s)"
    )
    parser.add_argument(
        "--triggers", type=int, help="--e2e: runs of the main producer (default 4; 2 on sqlite)"
    )
    parser.add_argument(
        "--executor",
        choices=("local", "sequential", "celery"),
        help="--e2e: Airflow executor (default: local on servers, sequential on sqlite); celery needs a "
        "Redis server (ADRF_REDIS_URL, default redis://127.0.0.1:6379) and requirements/celery-e2e-*.txt",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="--executor celery: 'airflow celery worker' processes (default %(default)s)",
    )
    parser.add_argument(
        "--worker-concurrency",
        type=int,
        default=4,
        help="--executor celery: slots per worker (default %(default)s)",
    )
    parser.add_argument(
        "--mapped-multi",
        type=int,
        default=8,
        help="--executor celery: mapped tasks with outlets [a, b] and as many with [b, a] per run "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--chaos",
        action="append",
        choices=("kill-scheduler", "kill-worker", "restart-db"),
        default=[],
        help="--executor celery, repeatable: fault injected while the producers run (restart-db restarts the "
        "database SERVER on this machine: every database on it, other users' too)",
    )
    parser.add_argument(
        "--stock-schedulers",
        type=int,
        default=0,
        metavar="N",
        help="--executor celery: in the fixed variant, the first N 'airflow scheduler' processes run stock "
        "Airflow (a rolling upgrade of HA schedulers: one fixed, one stock); default %(default)s",
    )
    parser.add_argument(
        "--parallelism",
        type=int,
        default=8,
        help="--e2e: tasks the executor takes per scheduler loop (default %(default)s)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=600,
        help="--e2e: seconds to wait for the drain (default %(default)s)",
    )
    parser.add_argument(
        "--keep-logs", metavar="DIR", help="--e2e: copy the scheduler and task logs of each run here"
    )
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")


def _terminate(signum, frame):
    raise KeyboardInterrupt


def main(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _terminate)  # clean up children and databases as on Ctrl-C
    return _main(args)  # errors and Ctrl-C are reported by reproduce.__main__


def _main(args: argparse.Namespace) -> int:
    backend = resolve_backend(args.backend, args.db_url)
    airflow_version = check_airflow_version()
    mode = "e2e" if args.e2e else "stress" if args.stress else "deterministic"
    if args.repeat < 1:
        raise ReproduceError("--repeat must be at least 1")
    if args.database is not None and backend == "sqlite":
        raise ReproduceError("--database names a server's database: SQLite runs on a temporary file")
    if args.database is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,62}", args.database):
        raise ReproduceError(
            f"--database {args.database!r}: 1 to 63 letters, digits, '_' or '-', not starting with '-'"
        )
    if mode == "deterministic":
        args.only = scenario_ids(args.only, backend)
    # Celery on SQLite is refused below, with its reason, before anything is installed for it
    check_requirements(backend, args.executor if mode == "e2e" and backend != "sqlite" else None)
    if mode == "e2e" and args.mapped < 30:
        print("reproduce: note: fewer than 30 mapped producer tasks rarely shows the race", file=sys.stderr)
    if mode == "e2e":
        from reproduce.e2e import dags_dir

        try:
            dags_dir()
        except FileNotFoundError as err:
            raise ReproduceError(str(err)) from None
    if mode == "e2e" and backend == "sqlite" and args.executor == "local":
        raise ReproduceError("Airflow runs no LocalExecutor on SQLite; use --executor sequential or a server")
    if args.chaos and not (mode == "e2e" and args.executor == "celery"):
        raise ReproduceError("--chaos needs --e2e --executor celery")
    if args.stock_schedulers and not (mode == "e2e" and args.executor == "celery"):
        raise ReproduceError("--stock-schedulers needs --e2e --executor celery")
    if args.stock_schedulers < 0:
        raise ReproduceError("--stock-schedulers must be 0 or more")
    if mode == "e2e" and args.executor == "celery":
        check_celery(backend, args)
    repeats = args.repeat if mode != "deterministic" else 1
    print(
        f"reproduce: {mode} on {backend}, Airflow {airflow_version}"
        + (f", seed {args.seed}" if mode != "deterministic" else "")
        + (f", {repeats} run(s) per variant" if repeats > 1 else ""),
        file=sys.stderr,
    )
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    for index in range(repeats):
        for variant in VARIANTS:
            label = f"{variant}" + (f" run {index + 1}/{repeats}" if repeats > 1 else "")
            result = run_child(
                _spec(args, mode, backend, variant, index, label), backend, args.db_url, label, args.database
            )
            result["run"] = index + 1
            runs.append(result)
    verdict = report.verdict(mode, runs)
    print(report.render(mode, backend, runs), flush=True)
    print(verdict.summary, flush=True)
    print(f"reproduce: {round(time.monotonic() - started)} s in all", file=sys.stderr)
    if args.json:
        document = {
            "mode": mode,
            "backend": backend,
            "airflow_version": airflow_version,
            "seed": args.seed if mode != "deterministic" else None,
            "ok": verdict.ok,
            "summary": verdict.summary,
            "runs": runs,
        }
        try:
            with open(args.json, "w") as handle:
                json.dump(document, handle, indent=2, default=str)
        except OSError as err:
            raise ReproduceError(f"cannot write --json {args.json}: {err}") from None
    return 0 if verdict.ok else 1


def resolve_backend(backend: str | None, db_url: str | None) -> str:
    if not db_url:
        return backend or "sqlite"
    scheme = db_url.split(":", 1)[0].split("+", 1)[0].lower()
    from_url = URL_SCHEMES.get(scheme)
    if from_url is None:
        raise ReproduceError(f"--db-url must be a PostgreSQL or MySQL/MariaDB server URL, not {scheme!r}")
    if backend and backend != from_url:
        raise ReproduceError(f"--backend {backend} does not match --db-url ({from_url})")
    return from_url


def scenario_ids(only: str | None, backend: str) -> list[str]:
    """--only's scenario ids, each known and able to happen on ``backend``; [] (all) without --only.
    A usage error otherwise, before any child interpreter starts."""
    applicable = catalog.applicable_ids(backend)
    if not only:
        return []
    known = {info.id.upper(): info for info in catalog.CATALOG}
    chosen = []
    for word in filter(None, (w.strip().upper() for w in only.split(","))):
        info = known.get(word)
        if info is None:
            raise ReproduceError(
                f"--only {word}: no such scenario; scenarios: {', '.join(i.id for i in catalog.CATALOG)} "
                f"(on {backend}: {', '.join(applicable)})"
            )
        if not info.applies_to(backend):
            raise ReproduceError(
                f"--only {info.id}: cannot happen on {backend}; it runs with "
                f"--backend {' or '.join(info.backends)}. On {backend}: {', '.join(applicable)}"
            )
        chosen.append(info.id)
    return chosen


def check_requirements(backend: str, executor: str | None) -> None:
    """The driver, time-machine and Celery that this run needs, or the one command that installs them."""
    needed = requirements.missing(backend, executor)
    if needed:
        raise ReproduceError(
            f"this run needs {' '.join(needed)}, not installed in {sys.executable}; install with: "
            f"{requirements.install_command(needed)}"
        )


def check_celery(backend: str, args: argparse.Namespace) -> None:
    """What --executor celery needs, checked before any database is made."""
    if backend == "sqlite":
        raise ReproduceError(
            "Airflow refuses CeleryExecutor on SQLite (one writer at a time; only SequentialExecutor runs "
            "there); use --backend postgres or mysql"
        )
    if args.workers < 1 or args.worker_concurrency < 1:
        raise ReproduceError("--workers and --worker-concurrency must be at least 1")
    import redis  # installed: check_requirements

    from reproduce.e2e_celery import redis_url

    try:
        redis.Redis.from_url(redis_url(), socket_timeout=5).ping()
    except redis.RedisError as err:
        raise ReproduceError(f"Redis at {redis_url()} (ADRF_REDIS_URL) is not reachable: {err}") from None
    if backend == "mysql" and args.schedulers == 2:
        print(
            "reproduce: note: Airflow supports several schedulers only on PostgreSQL and MySQL 8 "
            "(row locks); on MariaDB they collide without our code",
            file=sys.stderr,
        )


def check_airflow_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from airflow_dataset_race_fix.targets import SUPPORTED_AIRFLOW_VERSIONS

    try:
        found = version("apache-airflow")
    except PackageNotFoundError:
        raise ReproduceError(f"Apache Airflow is not installed in {sys.executable}") from None
    if found not in SUPPORTED_AIRFLOW_VERSIONS:
        raise ReproduceError(
            f"Airflow {found} is not supported; this package fixes Airflow "
            f"{SUPPORTED_AIRFLOW_VERSIONS[0]} to {SUPPORTED_AIRFLOW_VERSIONS[-1]}"
        )
    return found


def _spec(
    args: argparse.Namespace, mode: str, backend: str, variant: str, index: int, label: str
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "mode": mode,
        "backend": backend,
        "variant": variant,
        "progress_prefix": f"  [{label}] ",
    }
    if mode == "deterministic":
        spec["only"] = args.only  # checked ids (scenario_ids)
    elif mode == "stress":
        spec.update(
            seed=args.seed + index, producers=args.producers, events=args.events, schedulers=args.schedulers
        )
    else:
        spec.update(
            seed=args.seed + index,
            mapped=args.mapped,
            triggers=args.triggers,
            parallelism=args.parallelism,
            executor=args.executor,
            timeout=args.timeout,
            schedulers=args.schedulers,
            workers=args.workers,
            worker_concurrency=args.worker_concurrency,
            mapped_multi=args.mapped_multi if args.executor == "celery" else 0,
            chaos=args.chaos,
            stock_schedulers=args.stock_schedulers if variant == "fixed" else 0,
            keep_logs=os.path.join(args.keep_logs, f"{variant}-{index + 1}") if args.keep_logs else None,
        )
    return spec


def run_child(
    spec: dict[str, Any], backend: str, server_url: str | None, label: str, name: str | None = None
) -> dict[str, Any]:
    """Run one variant in a fresh interpreter on a database of its own (named ``name``); return its JSON."""
    database = ScratchDatabase(backend, server=server_url, **({"name": name} if name else {}))
    try:
        database.create()
    except DatabaseExists as err:
        raise ReproduceError(str(err)) from None
    except DatabaseUnavailable as err:
        raise ReproduceError(
            f"{err}\n  (start the server, or point --db-url / {_env_hint(backend)} at one)"
        ) from None
    except ImportError as err:
        raise ReproduceError(f"the {backend} driver is not installed: {err}") from None
    home = tempfile.TemporaryDirectory(prefix="adrf-reproduce-home-")
    spec = {**spec, "db_url": database.url, "airflow_home": home.name}
    print(f"reproduce: {label}: child interpreter on database {database.name}", file=sys.stderr, flush=True)
    try:
        from reproduce.shim import child_env

        # The child itself applies the fix in-process for deterministic and stress; the e2e
        # driver gives its Airflow processes the fix through PYTHONPATH (see shim.py).
        env = child_env(os.environ, "stock")
        child = subprocess.Popen(
            [*lab_command("reproduce.child"), json.dumps(spec)],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        try:
            stdout, _ = child.communicate()
        except BaseException:  # interrupted: let the child stop its scheduler, then drop the database
            child.terminate()
            child.wait(180)
            raise
    finally:
        try:
            database.drop()
        except DatabaseUnavailable as err:
            print(f"reproduce: warning: could not drop {database.name}: {err}", file=sys.stderr)
        home.cleanup()
    try:
        result = json.loads(stdout)
    except json.JSONDecodeError:
        raise ReproduceError(
            f"the {label} child interpreter exited with {child.returncode} without a result"
        ) from None
    if result.get("error") and _is_environment_error(result["error"]):
        raise ReproduceError(f"{label}: {result['error']}")
    return result


def _is_environment_error(message: str) -> bool:
    """Errors that no table can explain: the fix refused, or the database went away."""
    return message.startswith("the fix refused") or message.startswith("OperationalError")


def _env_hint(backend: str) -> str:
    return {"postgres": "ADRF_POSTGRES_URL", "mysql": "ADRF_MYSQL_URL"}.get(backend, "the URL")
