"""
One scratch metadata database per test session, on the backend named by ADRF_BACKEND
(sqlite, postgres or mysql; tox sets it per env). Airflow is pointed at it before it is
imported, and its schema is created once.
"""

from __future__ import annotations

import os

import pytest

from airflow_dataset_race_fix.harness.database import ScratchDatabase, configure_airflow_env

BACKEND = os.environ.get("ADRF_BACKEND", "sqlite")
_database = ScratchDatabase(BACKEND)
_database.create()
configure_airflow_env(_database.url)


def pytest_report_header(config):
    return f"airflow-dataset-race-fix: backend {BACKEND}, scratch database {_database.name}"


def pytest_sessionstart(session):
    from airflow_dataset_race_fix.harness.database import init_airflow_db

    init_airflow_db()


def pytest_sessionfinish(session, exitstatus):
    from airflow import settings

    settings.dispose_orm()
    _database.drop()


@pytest.fixture(params=["stock", "fixed"])
def variant(request):
    """Run the test against stock Airflow and against the fix, in this interpreter."""
    import airflow_dataset_race_fix

    airflow_dataset_race_fix.unapply()
    if request.param == "fixed":
        states = airflow_dataset_race_fix.apply(strict=True)
        assert {s.state for s in states} == {"patched"}
    yield request.param
    airflow_dataset_race_fix.unapply()


@pytest.fixture
def variant_fixed():
    import airflow_dataset_race_fix

    airflow_dataset_race_fix.unapply()
    airflow_dataset_race_fix.apply(strict=True)
    yield "fixed"
    airflow_dataset_race_fix.unapply()


@pytest.fixture
def variant_stock():
    import airflow_dataset_race_fix

    airflow_dataset_race_fix.unapply()
    yield "stock"


@pytest.fixture
def backend():
    return BACKEND
