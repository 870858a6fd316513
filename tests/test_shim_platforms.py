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
from conftest import AIRFLOW_VERSION
from matrix import ON_SQLITE_ONLY
from shim_children import (
    ALL_PATCHED,
    IMPORT_TARGETS,
    PYTHON,
    TARGETS,
    airflow_shadow,
    child_env,
    output,
    result,
    run_python,
    run_status,
    shim_env,
)

pytestmark = ON_SQLITE_ONLY

ALL_REFUSED = {name: "refused" for name in TARGETS}


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
    _rewrite(
        os.path.join(site, "airflow", "__init__.py"),
        f'__version__ = "{AIRFLOW_VERSION}"',
        f'__version__ = "{version}"',
    )
    (dist_info,) = [d for d in os.listdir(site) if d.endswith(".dist-info")]
    renamed = os.path.join(site, f"apache_airflow-{version}.dist-info")
    os.rename(os.path.join(site, dist_info), renamed)
    _rewrite(os.path.join(renamed, "METADATA"), f"\nVersion: {AIRFLOW_VERSION}\n", f"\nVersion: {version}\n")
    return site, version


# Cloud Composer's manager.py, as apache/airflow#62501 changes it: the event committed in its
# own session at once, and the queue rows upserted with a guard against older timestamps.
COMPOSER_CHANGES = (
    (
        "        session.flush()\n\n        cls.notify_dataset_changed(",
        "        session.commit()\n\n        cls.notify_dataset_changed(",
    ),
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
    proc = run_python(
        IMPORT_TARGETS + "\nimport airflow; print('VERSION', airflow.__version__)", shim_env(site)
    )
    assert f"VERSION {version}" in proc.stdout
    assert result(proc)["states"] == ALL_PATCHED
    status = run_status(shim_env(site))
    assert status.returncode == 0, output(status)
    assert (
        f"Airflow: {version} (a local build of {AIRFLOW_VERSION}: judged by its targeted members)"
        in status.stdout
    )
    assert status.stdout.count("fixed-by-shim") == 2


def test_a_local_build_whose_manager_carries_its_own_fix_is_refused_and_says_why(composer):
    site, version = composer
    proc = run_python(IMPORT_TARGETS, shim_env(site))
    assert result(proc)["states"] == ALL_REFUSED
    (warning,) = [
        line for line in output(proc).splitlines() if "WARNING" in line and "airflow-dataset-race-fix" in line
    ]
    member = "airflow.datasets.manager.DatasetManager.register_dataset_change"
    assert f"Airflow {version} is a local build: {member} is not" in warning
    assert (
        "Cloud Composer's build carries its own partial fix" in warning
        and "cannot replace it safely" in warning
    )
    assert (
        "never replaced" in warning
        and "'airflow-dataset-race-fix audit', 'explain' and the Dataset runs page" in warning
    )
    status = run_status(shim_env(site))
    assert status.returncode == 1, output(status)
    assert f"Airflow: {version} (a local build of {AIRFLOW_VERSION}" in status.stdout
    assert (
        "Cloud Composer's build carries its own partial fix" in status.stdout
        and "Fix active: NO" in status.stdout
    )


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
    return shim_env(
        custom_managers,
        switches=switches,
        AIRFLOW__CORE__DATASET_MANAGER_CLASS=f"adrf_custom_managers.{name}",
    )


def test_a_custom_manager_that_overrides_a_fixed_member_is_refused_and_said(custom_managers):
    env = _manager_env(custom_managers, "Overriding")
    proc = run_python(IMPORT_TARGETS, env)
    assert result(proc)["states"] == ALL_REFUSED
    (warning,) = [
        line for line in output(proc).splitlines() if "WARNING" in line and "airflow-dataset-race-fix" in line
    ]
    bypass = (
        "[core] dataset_manager_class is adrf_custom_managers.Overriding, which overrides the fixed "
        "DatasetManager.register_dataset_change: its own code would run instead of the fix"
    )
    assert bypass in warning
    status = run_status(env)
    assert status.returncode == 1 and bypass in status.stdout, output(status)

    strict = run_python(
        IMPORT_TARGETS, _manager_env(custom_managers, "Overriding", AIRFLOW_DATASET_RACE_FIX_STRICT="1")
    )
    assert strict.returncode == 1 and "RefusedError: airflow-dataset-race-fix (strict)" in strict.stderr
    assert bypass in strict.stderr


def test_a_custom_manager_that_overrides_no_fixed_member_inherits_the_fix(custom_managers):
    env = _manager_env(custom_managers, "Inheriting")
    code = (
        IMPORT_TARGETS
        + """
from airflow.datasets.manager import dataset_manager
from airflow_dataset_race_fix.fix.datasets.manager import DatasetManager as Fixed
print("INHERITS", type(dataset_manager).__name__, type(dataset_manager).register_dataset_change.__func__
      is Fixed.register_dataset_change.__func__)
"""
    )
    proc = run_python(code, env)
    assert result(proc)["states"] == ALL_PATCHED and "INHERITS Inheriting True" in proc.stdout
    assert run_status(env).returncode == 0


# --- tools that put their own sitecustomize first ---------------------------------------------

# Current releases (issue 48); both need Python 3.10. Their exporters and network calls off.
INSTRUMENTATION = ("opentelemetry-distro==0.66b1", "opentelemetry-instrumentation==0.66b1", "ddtrace==4.16.0")
QUIET_TOOLS = {
    "OTEL_TRACES_EXPORTER": "none",
    "OTEL_METRICS_EXPORTER": "none",
    "OTEL_LOGS_EXPORTER": "none",
    "DD_TRACE_ENABLED": "false",
    "DD_INSTRUMENTATION_TELEMETRY_ENABLED": "false",
    "DD_REMOTE_CONFIGURATION_ENABLED": "false",
    "DD_CRASHTRACKING_ENABLED": "false",
}
# What each Airflow component does as it starts (airflow.jobs.job.Job, 'tasks run'):
# the listeners' on_starting.
COMPONENT_STARTS = (
    IMPORT_TARGETS
    + """
from airflow.listeners.listener import get_listener_manager
get_listener_manager().hook.on_starting(component=None)
get_listener_manager().hook.on_starting(component=None)
"""
)


@pytest.fixture(scope="module")
def instrumented(tmp_path_factory):
    """A virtualenv with opentelemetry-instrument and ddtrace-run that sees this one's packages; its bin/."""
    import sys
    import sysconfig

    if sys.version_info < (3, 10):
        pytest.skip("opentelemetry-distro 0.66b1 and ddtrace 4.16.0 need Python 3.10")
    venv = tmp_path_factory.mktemp("instrumented") / "venv"
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with open(os.path.join(site, "00-adrf-test-link.pth"), "w") as f:  # after the venv's own packages
        f.write(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    install = subprocess.run(
        [PYTHON, "-m", "pip", "--python", python, "install", "-q", *INSTRUMENTATION],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, output(install)[-3000:]
    return str(venv / "bin")


def _our_lines(proc, level: str) -> list[str]:
    return [
        line for line in output(proc).splitlines() if level in line and "airflow-dataset-race-fix" in line
    ]


def test_opentelemetry_instrument_displaces_the_pythonpath_route_and_the_process_says_so(instrumented):
    tool = [os.path.join(instrumented, "opentelemetry-instrument"), os.path.join(instrumented, "python")]
    env = shim_env(**QUIET_TOOLS)
    proc = subprocess.run(
        [*tool, "-c", COMPONENT_STARTS], env=env, capture_output=True, text=True, timeout=180
    )
    assert result(proc)["states"] == {name: "patchable" for name in TARGETS} and result(proc)["routes"] == []
    (warning,) = _our_lines(proc, "WARNING")
    assert "the fix is NOT in place in this process: displaced: its directory is on PYTHONPATH" in warning
    assert "opentelemetry/instrumentation/auto_instrumentation/sitecustomize.py ran instead" in warning
    assert "'airflow-dataset-race-fix shim install-pth'" in warning
    status = subprocess.run(
        [*tool, "-m", "airflow_dataset_race_fix", "status"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert status.returncode == 1 and "the shim is displaced" in status.stdout, output(status)


def test_the_pth_route_survives_opentelemetry_instrument(instrumented):
    tool = [os.path.join(instrumented, "opentelemetry-instrument"), os.path.join(instrumented, "python")]
    adrf = [os.path.join(instrumented, "python"), "-m", "airflow_dataset_race_fix", "shim"]
    assert subprocess.run([*adrf, "install-pth"], env=child_env(), capture_output=True).returncode == 0
    try:
        env = child_env(**QUIET_TOOLS)
        proc = subprocess.run(
            [*tool, "-c", COMPONENT_STARTS], env=env, capture_output=True, text=True, timeout=180
        )
        report = result(proc)
        assert report["states"] == ALL_PATCHED and report["routes"] == ["pth"]
        assert _our_lines(proc, "WARNING") == [] and len(_our_lines(proc, "INFO")) == 2, output(proc)[-3000:]
        status = subprocess.run(
            [*tool, "-m", "airflow_dataset_race_fix", "status"],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert status.returncode == 0, output(status)
    finally:
        subprocess.run([*adrf, "remove-pth"], env=child_env(), capture_output=True)


@pytest.mark.parametrize("order", ["ddtrace-run-first", "ours-first"])
def test_ddtrace_run_chains_in_both_orders(instrumented, order):
    python = os.path.join(instrumented, "python")
    code = IMPORT_TARGETS.replace("_report()", "_report(ddtrace='ddtrace.bootstrap' in str(sys.modules))")
    if order == "ddtrace-run-first":  # ddtrace-run puts its directory in front of ours
        command, env = [os.path.join(instrumented, "ddtrace-run"), python], shim_env(**QUIET_TOOLS)
    else:
        ddtrace_dir = subprocess.run(
            [
                python,
                "-c",
                "import ddtrace.bootstrap, os; print(os.path.dirname(ddtrace.bootstrap.__file__))",
            ],
            capture_output=True,
            text=True,
        ).stdout.strip()
        command, env = [python], shim_env(ddtrace_dir, **QUIET_TOOLS)
    report = result(
        subprocess.run([*command, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    )
    assert report["states"] == ALL_PATCHED and report["routes"] == ["sitecustomize"] and report["ddtrace"]
