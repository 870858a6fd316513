"""
The shim where Airflow 2 runs in practice (issue 48): local builds (Astronomer's
``2.10.5+astro.N``, Cloud Composer's ``2.10.x+composer``), a custom
``[core] dataset_manager_class``, and tools that put their own sitecustomize first
(``opentelemetry-instrument``, ``ddtrace-run``, the real PyPI packages).

A local build is a real Airflow installation on the path: this virtualenv's, as a tree of
links (``airflow_shadow``), with its version rewritten in ``airflow/__init__.py`` and in its
dist-info, and for Composer's build ``manager.py`` carrying a #62501-style change.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from shim_children import (
    PYTHON,
    REPORT_CODE,
    airflow_shadow,
    child_env,
    output,
    result,
    run_python,
    run_status,
    shim_env,
)

from airflow_dataset_race_fix import BOOTSTRAP_DIR

from conftest import AIRFLOW_VERSION
from matrix import ON_SQLITE_ONLY

pytestmark = ON_SQLITE_ONLY

TARGETS = ("airflow.datasets.manager", "airflow.jobs.scheduler_job_runner")
ALL_PATCHED = {name: "patched" for name in TARGETS}
ALL_REFUSED = {name: "refused" for name in TARGETS}
IMPORT_TARGETS = REPORT_CODE + """
import airflow.datasets.manager, airflow.jobs.scheduler_job_runner
_report()
"""


def _rewrite(path: str, old: str, new: str) -> None:
    """Replace the link ``path`` by a copy with ``old`` replaced (it must be there)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert old in text, f"{old!r} not in {path}"
    os.unlink(path)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(old, new))


def local_build(root: str, label: str) -> tuple[str, str]:
    """This Airflow rebuilt as ``<release>+<label>``: (site directory to put on the path, version)."""
    site = airflow_shadow(root)
    version = f"{AIRFLOW_VERSION}+{label}"
    _rewrite(os.path.join(site, "airflow", "__init__.py"), f'__version__ = "{AIRFLOW_VERSION}"', f'__version__ = "{version}"')
    (dist_info,) = [d for d in os.listdir(site) if d.endswith(".dist-info")]
    renamed = os.path.join(site, f"apache_airflow-{version}.dist-info")
    os.rename(os.path.join(site, dist_info), renamed)
    _rewrite(os.path.join(renamed, "METADATA"), f"\nVersion: {AIRFLOW_VERSION}\n", f"\nVersion: {version}\n")
    return site, version


# Cloud Composer's manager.py, as apache/airflow#62501 changes it: the event committed in its
# own session at once, and the queue rows upserted with a guard against older timestamps.
COMPOSER_CHANGES = (
    ("        session.flush()\n\n        cls.notify_dataset_changed(", "        session.commit()\n\n        cls.notify_dataset_changed("),
    (
        "insert(DatasetDagRunQueue).values(dataset_id=dataset_id).on_conflict_do_nothing()",
        "insert(DatasetDagRunQueue).values(dataset_id=dataset_id)\n        stmt = stmt.on_conflict_do_update("
        "index_elements=['dataset_id', 'target_dag_id'], set_={'created_at': stmt.excluded.created_at}, "
        "where=DatasetDagRunQueue.created_at < stmt.excluded.created_at)",
    ),
)


@pytest.fixture(scope="module")
def astronomer(tmp_path_factory):
    return local_build(str(tmp_path_factory.mktemp("astro")), "astro.3")


@pytest.fixture(scope="module")
def composer(tmp_path_factory):
    site, version = local_build(str(tmp_path_factory.mktemp("composer")), "composer")
    for old, new in COMPOSER_CHANGES:
        _rewrite(os.path.join(site, "airflow", "datasets", "manager.py"), old, new)
    return site, version


def test_a_local_build_with_the_release_s_members_is_fixed_and_status_names_it(astronomer):
    site, version = astronomer
    proc = run_python(IMPORT_TARGETS + "\nimport airflow; print('VERSION', airflow.__version__)", shim_env(site))
    assert f"VERSION {version}" in proc.stdout
    assert result(proc)["states"] == ALL_PATCHED
    status = run_status(shim_env(site))
    assert status.returncode == 0, output(status)
    assert f"Airflow: {version} (a local build of {AIRFLOW_VERSION}: judged by its targeted members)" in status.stdout
    assert status.stdout.count("fixed-by-shim") == 2


def test_a_local_build_whose_manager_carries_its_own_fix_is_refused_and_says_why(composer):
    site, version = composer
    proc = run_python(IMPORT_TARGETS, shim_env(site))
    assert result(proc)["states"] == ALL_REFUSED
    (warning,) = [line for line in output(proc).splitlines() if "WARNING" in line and "airflow-dataset-race-fix" in line]
    assert f"Airflow {version} is a local build: airflow.datasets.manager.DatasetManager.register_dataset_change is not" in warning
    assert "Cloud Composer's build carries its own partial fix" in warning and "cannot replace it safely" in warning
    assert "never replaced" in warning and "'airflow-dataset-race-fix audit', 'explain' and the Dataset runs page" in warning
    status = run_status(shim_env(site))
    assert status.returncode == 1, output(status)
    assert f"Airflow: {version} (a local build of {AIRFLOW_VERSION}" in status.stdout
    assert "Cloud Composer's build carries its own partial fix" in status.stdout and "Fix active: NO" in status.stdout


# --- [core] dataset_manager_class ---------------------------------------------------------------

CUSTOM_MANAGERS = '''
from airflow.datasets.manager import DatasetManager


class Overriding(DatasetManager):
    """Adds a metric around register_dataset_change: its own code runs, not the fix."""

    @classmethod
    def register_dataset_change(cls, *args, **kwargs):
        return super().register_dataset_change(*args, **kwargs)


class Inheriting(DatasetManager):
    """Overrides nothing the fix replaces: it inherits the fix."""

    def notify_dataset_created(self, dataset, extra=None):
        super().notify_dataset_created(dataset, extra)
'''


@pytest.fixture(scope="module")
def custom_managers(tmp_path_factory):
    directory = tmp_path_factory.mktemp("custom-manager")
    (directory / "adrf_custom_managers.py").write_text(CUSTOM_MANAGERS)
    return str(directory)


def _manager_env(custom_managers: str, name: str, **switches: str) -> dict[str, str]:
    return shim_env(custom_managers, switches=switches, AIRFLOW__CORE__DATASET_MANAGER_CLASS=f"adrf_custom_managers.{name}")


def test_a_custom_manager_that_overrides_a_fixed_member_is_refused_and_said(custom_managers):
    env = _manager_env(custom_managers, "Overriding")
    proc = run_python(IMPORT_TARGETS, env)
    assert result(proc)["states"] == ALL_REFUSED
    (warning,) = [line for line in output(proc).splitlines() if "WARNING" in line and "airflow-dataset-race-fix" in line]
    bypass = ("[core] dataset_manager_class is adrf_custom_managers.Overriding, which overrides the fixed "
              "DatasetManager.register_dataset_change: its own code would run instead of the fix")
    assert bypass in warning
    status = run_status(env)
    assert status.returncode == 1 and bypass in status.stdout, output(status)

    strict = run_python(IMPORT_TARGETS, _manager_env(custom_managers, "Overriding", AIRFLOW_DATASET_RACE_FIX_STRICT="1"))
    assert strict.returncode == 1 and "RefusedError: airflow-dataset-race-fix (strict)" in strict.stderr
    assert bypass in strict.stderr


def test_a_custom_manager_that_overrides_no_fixed_member_inherits_the_fix(custom_managers):
    env = _manager_env(custom_managers, "Inheriting")
    code = IMPORT_TARGETS + """
from airflow.datasets.manager import dataset_manager
from airflow_dataset_race_fix.fix.datasets.manager import DatasetManager as Fixed
print("INHERITS", type(dataset_manager).__name__, type(dataset_manager).register_dataset_change.__func__
      is Fixed.register_dataset_change.__func__)
"""
    proc = run_python(code, env)
    assert result(proc)["states"] == ALL_PATCHED and "INHERITS Inheriting True" in proc.stdout
    assert run_status(env).returncode == 0
