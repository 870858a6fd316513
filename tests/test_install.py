"""
The pinned install works as an operator would use it: `airflow version` and `airflow db
migrate`, for the Airflow release installed here (tox: one env per release and Python),
installed from its pins for this Python in requirements/.
"""

from __future__ import annotations

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

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
PINS = Path(__file__).resolve().parents[1] / "requirements" / f"constraints-airflow-{AIRFLOW_VERSION}-py{PYTHON}.txt"


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
