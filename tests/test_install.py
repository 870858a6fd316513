"""
The pinned install works as an operator would use it: `airflow version` and `airflow db
migrate`, for the Airflow release installed here (tox: one env per release and Python),
installed from its pins for this Python in requirements/.
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from airflow_dataset_race_fix.harness.database import ScratchDatabase

from conftest import AIRFLOW_VERSION, BACKEND

REPO = Path(__file__).resolve().parents[1]
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
PINS = REPO / "requirements" / f"constraints-airflow-{AIRFLOW_VERSION}-py{PYTHON}.txt"
# The Python of the tox envs whose names have no pyNN factor: tox's own, CI's python3.
TOX_OWN_PYTHON = "3.11"


def _pins() -> dict[str, str]:
    """{normalized name: version} of the pins file."""
    pins = {}
    for line in PINS.read_text().splitlines():
        if line and not line.startswith("#"):
            name, pinned = line.split("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = pinned
    return pins


def test_this_release_is_installed_from_its_pins():
    assert PINS.is_file(), f"no pins for the installed apache-airflow {AIRFLOW_VERSION} on Python {PYTHON}: {PINS}"
    pins = _pins()
    assert pins["apache-airflow"] == AIRFLOW_VERSION
    installed = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version for d in metadata.distributions()}
    differ = {name: (pinned, installed[name]) for name, pinned in pins.items() if installed.get(name, pinned) != pinned}
    assert not differ, f"installed versions differ from {PINS.name} (pinned, installed): {differ}"


def _airflow(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    airflow = shutil.which("airflow", path=os.path.dirname(sys.executable)) or "airflow"
    return subprocess.run([airflow, *args], env=env, capture_output=True, text=True, timeout=600)


def test_airflow_version_and_db_migrate_on_a_fresh_database():
    database = ScratchDatabase(BACKEND)
    database.create()
    home = tempfile.mkdtemp(prefix="adrf-migrate-")
    try:
        env = dict(
            os.environ,
            AIRFLOW_HOME=home,
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=database.url,
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
        )
        version = _airflow("version", env=env)
        assert version.returncode == 0, version.stderr
        assert version.stdout.strip().splitlines()[-1] == AIRFLOW_VERSION
        migrate = _airflow("db", "migrate", env=env)
        assert migrate.returncode == 0, migrate.stderr[-3000:]
        check = _airflow("db", "check-migrations", "-t", "0", env=env)
        assert check.returncode == 0, check.stderr[-3000:]
    finally:
        database.drop()
        shutil.rmtree(home, ignore_errors=True)


def _expand(name: str) -> list[str]:
    """tox's generative names: 'py{39,310}-a' -> ['py39-a', 'py310-a']."""
    brace = re.search(r"\{([^{}]*)\}", name)
    if not brace:
        return [name]
    return [n for alt in brace.group(1).split(",") for n in _expand(name[: brace.start()] + alt + name[brace.end() :])]


def _tox_matrix() -> set[tuple[str, str]]:
    """(Airflow release, Python) of every env in tox's env_list."""
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(REPO / "tox.ini")
    releases = dict(re.findall(r"^\s*(airflow\d+): apache-airflow==(\S+)$", tox["testenv"]["deps"], re.M))
    matrix = set()
    for line in tox["tox"]["env_list"].split("\n"):
        line = line.split("#")[0].strip()
        for env in _expand(line) if line else []:
            factors = env.split("-")
            python = next((f"{f[2]}.{f[3:]}" for f in factors if re.fullmatch(r"py\d+", f)), TOX_OWN_PYTHON)
            matrix.add((next(releases[f] for f in factors if f in releases), python))
    return matrix


def test_the_package_claims_the_pythons_that_the_matrix_runs_and_each_has_its_pins():
    matrix = _tox_matrix()
    pythons = sorted({python for _, python in matrix}, key=lambda v: tuple(map(int, v.split("."))))
    setup = configparser.ConfigParser(interpolation=None)
    setup.read(REPO / "setup.cfg")
    assert setup["options"]["python_requires"].strip() == f">={pythons[0]}"
    classifiers = re.findall(r"Programming Language :: Python :: (3\.\d+)", setup["metadata"]["classifiers"])
    assert classifiers == pythons
    missing = [
        f"constraints-airflow-{release}-py{python}.txt"
        for release, python in sorted(matrix)
        if not (REPO / "requirements" / f"constraints-airflow-{release}-py{python}.txt").is_file()
    ]
    assert not missing, f"tox envs without their pins in requirements/: {missing}"
