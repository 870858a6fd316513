"""The pinned install works as an operator would use it: `airflow version` and `airflow db migrate`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from airflow_dataset_race_fix.harness.database import ScratchDatabase

from conftest import BACKEND


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
        assert version.stdout.strip().splitlines()[-1] == "2.10.4"
        migrate = _airflow("db", "migrate", env=env)
        assert migrate.returncode == 0, migrate.stderr[-3000:]
        check = _airflow("db", "check-migrations", "-t", "0", env=env)
        assert check.returncode == 0, check.stderr[-3000:]
    finally:
        database.drop()
        shutil.rmtree(home, ignore_errors=True)
