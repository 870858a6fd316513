"""
One scratch metadata database per test session, on the backend named by ADRF_BACKEND
(sqlite, postgres or mysql; tox sets it per env). Airflow is pointed at it before it is
imported, and its schema is created once.
"""

from __future__ import annotations

import os
import tempfile
from importlib import metadata

import pytest

from reproduce.harness.database import ScratchDatabase, configure_airflow_env

BACKEND = os.environ.get("ADRF_BACKEND", "sqlite")
# The Airflow release installed here (tox: one env per release), read without importing it.
AIRFLOW_VERSION = metadata.version("apache-airflow")
# The fix's sweep for unqueued events runs in every scheduler loop here (default: every 10 s
# of real time), so that a scenario's loops, not the test's speed, decide when it runs.
os.environ.setdefault("AIRFLOW__DATASET_RACE_FIX__REQUEUE_INTERVAL_SECONDS", "0")
_database = ScratchDatabase(BACKEND)
_database.create()
_airflow_home = tempfile.TemporaryDirectory(prefix="adrf-airflow-home-")
configure_airflow_env(_database.url, _airflow_home.name)


def pytest_report_header(config):
    return (
        f"airflow-dataset-race-fix: Airflow {AIRFLOW_VERSION}, backend {BACKEND}, "
        f"scratch database {_database.name}"
    )


def pytest_collection_modifyitems(config, items):
    from matrix import place_by_release

    place_by_release(items)


def pytest_sessionstart(session):
    from reproduce.harness.database import init_airflow_db

    init_airflow_db()


def pytest_sessionfinish(session, exitstatus):
    from airflow import settings

    settings.dispose_orm()
    _database.drop()
    _airflow_home.cleanup()


# ADRF_FIX_MODE=source: the fix is in Airflow's files (source patches applied to this
# virtualenv with 'airflow-dataset-race-fix apply'), not installed by the shim. "fixed"
# then only checks that the runtime sees the patched source (and stays idle); stock
# Airflow does not exist in such an install, so stock variants are skipped.
FIX_MODE = os.environ.get("ADRF_FIX_MODE", "shim")
SOURCE_MODE = FIX_MODE == "source"
_SKIP_STOCK = "stock Airflow cannot run in a source-patched install (ADRF_FIX_MODE=source)"


def _assert_source_patched():
    import importlib

    from airflow_dataset_race_fix import runtime
    from airflow_dataset_race_fix.targets import TARGET_MODULES

    states = {}
    for name in TARGET_MODULES:
        importlib.import_module(name)
        states[name] = runtime.module_state(name).state
    assert set(states.values()) == {runtime.SOURCE_PATCHED}, f"source patches not applied here: {states}"


@pytest.fixture(params=["stock", "fixed"])
def variant(request):
    """Run the test against stock Airflow and against the fix, in this interpreter."""
    import airflow_dataset_race_fix

    if SOURCE_MODE:
        if request.param == "stock":
            pytest.skip(_SKIP_STOCK)
        _assert_source_patched()
        yield request.param
        return
    airflow_dataset_race_fix.unapply()
    if request.param == "fixed":
        states = airflow_dataset_race_fix.apply(strict=True)
        assert {s.state for s in states} == {"patched"}
    yield request.param
    airflow_dataset_race_fix.unapply()


@pytest.fixture
def variant_fixed():
    import airflow_dataset_race_fix

    if SOURCE_MODE:
        _assert_source_patched()
        yield "fixed"
        return
    airflow_dataset_race_fix.unapply()
    airflow_dataset_race_fix.apply(strict=True)
    yield "fixed"
    airflow_dataset_race_fix.unapply()


@pytest.fixture
def world(request, variant_fixed):
    """A World named after the test (without its "test_"), on the fixed code; closed after."""
    from reproduce.harness.world import World

    w = World(request.node.name[5:25])
    yield w
    w.close()


@pytest.fixture
def variant_stock():
    import airflow_dataset_race_fix

    if SOURCE_MODE:
        pytest.skip(_SKIP_STOCK)
    airflow_dataset_race_fix.unapply()
    yield "stock"


@pytest.fixture
def backend():
    return BACKEND
