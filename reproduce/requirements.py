"""
What a ``reproduce`` run needs beyond the package and Airflow, and the one command that
installs it: time-machine (the harness's clock: the ``[reproduce]`` extra), the chosen
backend's driver (``[postgres]``, ``[mysql]``) and, for ``--executor celery``, the Celery
pins. Imports nothing from Airflow.

``python -m reproduce.requirements REPRODUCE-OPTIONS`` prints the
missing pip requirements one per line (nothing when all is there): ``reproduce/run`` installs
them into its .venv before it starts the run.
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

# backend: (module that must import, pip requirement that provides it)
DRIVERS = {"postgres": ("psycopg2", "psycopg2-binary"), "mysql": ("MySQLdb", "mysqlclient")}
# The repository's requirements/ when the package runs from a clone (an editable install).
REQUIREMENTS_DIR = Path(__file__).resolve().parents[1] / "requirements"
CELERY_AIRFLOW = "2.10.4"  # the release the Celery pins were checked against


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _distribution_installed(name: str) -> bool:
    try:
        version(name)
    except PackageNotFoundError:
        return False
    return True


def _requirements_file(name: str) -> str:
    """A file of the repository's requirements/, by absolute path when this is a clone."""
    path = REQUIREMENTS_DIR / name
    return str(path) if path.is_file() else f"$ADRF/requirements/{name}"


def missing(backend: str, executor: str | None) -> list[str]:
    """pip arguments for what this run needs and this interpreter lacks."""
    needed = []
    if not _installed("time_machine"):
        needed.append("time-machine")
    if backend in DRIVERS and not _installed(DRIVERS[backend][0]):
        needed.append(DRIVERS[backend][1])
    if executor == "celery" and not (
        _distribution_installed("apache-airflow-providers-celery") and _installed("redis")
    ):
        needed += ["-r", _requirements_file(f"celery-e2e-airflow-{CELERY_AIRFLOW}-py3.11.txt")]
    return needed


def install_command(needed: list[str]) -> str:
    """The one command that installs ``needed`` with the pins of the installed Airflow."""
    try:
        airflow = version("apache-airflow")
    except PackageNotFoundError:
        airflow = CELERY_AIRFLOW
    constraints = _requirements_file(f"constraints-airflow-{airflow}-py3.11.txt")
    return f"{shlex.quote(sys.executable)} -m pip install -c {shlex.quote(constraints)} " + " ".join(
        shlex.quote(n) for n in needed
    )


def main(argv: list[str] | None = None) -> int:
    from reproduce.runner import ReproduceError, resolve_backend

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--backend")
    parser.add_argument("--db-url")
    parser.add_argument("--executor")
    args, _ = parser.parse_known_args(argv)
    try:
        backend = resolve_backend(args.backend, args.db_url)
    except ReproduceError:  # a bad option: the run itself reports it, in one line
        return 0
    for requirement in missing(backend, args.executor):
        print(requirement)
    return 0


if __name__ == "__main__":
    sys.exit(main())
