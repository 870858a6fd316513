"""
The start-up shim in real interpreters: routes, chaining, import orders, guards, switches.

Every test starts fresh Python processes of the test virtualenv (``sys.executable``) and
reads what they report; nothing here patches the test process itself. The Airflow
installation is never modified: an "unsupported version" or a "changed target" is
produced inside the child, by a user sitecustomize that runs before the shim's hooks,
the way another tool or a custom build would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sysconfig

import pytest
from conftest import AIRFLOW_VERSION
from matrix import ON_SQLITE_ONLY
from shim_children import (
    ALL_ORIGINAL,
    ALL_PATCHED,
    IMPORT_TARGETS,
    INFO_LINE,
    PYTHON,
    REPORT_CODE,
    TARGETS,
    airflow_shadow,
    assert_fixed_once,
    child_env,
    count,
    output,
    readme_local_settings,
    result,
    run_python,
    run_status,
    shim_env,
    status_json,
    write_sitecustomize,
)

from airflow_dataset_race_fix import BOOTSTRAP_DIR
from airflow_dataset_race_fix.targets import MEMBERS

pytestmark = ON_SQLITE_ONLY


# A user's sitecustomize that pins Airflow's reported version to an unsupported one
# before any target module is imported.
# An Airflow release the fix was not checked against. Newer, not older (2.9.3), since the
# FAB provider pinned with Airflow 2.11.x refuses to import under an Airflow before 2.11.1.
UNSUPPORTED_VERSION = "2.12.0"
UNSUPPORTED_AIRFLOW = f"""
import airflow
airflow.__version__ = "{UNSUPPORTED_VERSION}"
"""

# Another tool's patch of one targeted member, in place before our hook sees the class.
OTHER_PATCH = """
import airflow.datasets.manager as manager

def _postgres_queue_dagruns(cls, dataset_id, dags_to_queue, session):
    return None  # someone else's idea

manager.DatasetManager._postgres_queue_dagruns = classmethod(_postgres_queue_dagruns)
"""


# --- start-up ---------------------------------------------------------------------------


STARTUP_MODULES = ("airflow", "airflow_dataset_race_fix.targets", "typing", "inspect")
LOADED_AT_START = f"""
import sys
before = {{name: name in sys.modules for name in {STARTUP_MODULES!r}}}
"""


def test_startup_with_the_shim_alone_does_not_import_airflow():
    plain = result(
        run_python(LOADED_AT_START + "import json\nprint('RESULT ' + json.dumps(before))", child_env())
    )
    code = (
        LOADED_AT_START
        + REPORT_CODE
        + f"""
from airflow_dataset_race_fix.post_import import PostImportFinder
_report(
    before=before,
    sitecustomize_loaded=sys.modules["sitecustomize"].loaded,
    finder_first=isinstance(sys.meta_path[0], PostImportFinder),
    bootstrap_dir_kept=sys.path.count({BOOTSTRAP_DIR!r}),
)
"""
    )
    proc = run_python(code, shim_env())
    report = result(proc)
    # Nothing heavy at start: not airflow, not the target list (it needs inspect), nothing
    # that this interpreter does not load without the shim (a Python 3.9 virtualenv's
    # _virtualenv.pth imports typing before any sitecustomize runs).
    assert report["before"] == {**plain, "airflow": False, "airflow_dataset_race_fix.targets": False}
    assert report["airflow_imported"] is False
    assert report["sitecustomize_loaded"] is True
    assert report["finder_first"] is True
    assert report["bootstrap_dir_kept"] == 1
    assert report["routes"] == ["sitecustomize"] and report["started"] is True
    assert report["chained"] is None
    assert report["states"] == {name: "pending" for name in TARGETS}
    assert proc.stderr == ""


def test_the_plain_check_from_the_issue_prints_false():
    proc = run_python("import sys; print('airflow' in sys.modules)", shim_env())
    assert proc.returncode == 0 and proc.stdout.strip() == "False", output(proc)


def test_a_user_sitecustomize_still_runs_and_is_chained(tmp_path):
    user = write_sitecustomize(
        str(tmp_path / "user"),
        """
        import sys
        sys.user_sitecustomize_ran = True
        print("USER SITECUSTOMIZE RAN")
    """,
    )
    code = IMPORT_TARGETS.replace(
        "_report()", "_report(user=sys.user_sitecustomize_ran, module=sys.modules['sitecustomize'].__file__)"
    )
    proc = run_python(code, shim_env(str(tmp_path / "user")))
    report = result(proc)
    assert count(proc.stdout, "USER SITECUSTOMIZE RAN") == 1
    assert report["user"] is True and report["chained"] == user and report["module"] == user
    assert report["states"] == ALL_PATCHED


def test_a_failing_user_sitecustomize_is_reported_and_the_shim_still_starts(tmp_path):
    write_sitecustomize(str(tmp_path / "user"), "raise RuntimeError('broken user sitecustomize')\n")
    proc = run_python(IMPORT_TARGETS, shim_env(str(tmp_path / "user")))
    report = result(proc)
    assert "Error in sitecustomize" in proc.stderr and "broken user sitecustomize" in proc.stderr
    assert report["chained"] is None and report["states"] == ALL_PATCHED


def test_python_dash_S_skips_the_shim_quietly_and_the_explicit_import_still_works():
    # -S: site does not run, so neither sitecustomize nor .pth files; PYTHONPATH stays.
    quiet = run_python(
        "import sys; print('sitecustomize' in sys.modules, 'airflow_dataset_race_fix' in sys.modules)",
        shim_env(),
        "-S",
    )
    assert quiet.returncode == 0 and quiet.stdout.split() == ["False", "False"], output(quiet)
    assert quiet.stderr == ""

    src = os.path.dirname(os.path.dirname(BOOTSTRAP_DIR))
    explicit = (
        REPORT_CODE
        + f"""
sys.path[:0] = [{sysconfig.get_paths()["purelib"]!r}, {src!r}]
import airflow_dataset_race_fix.auto
import airflow.jobs.scheduler_job_runner, airflow.datasets.manager
_report()
"""
    )
    report = result(run_python(explicit, child_env(), "-S"))
    assert report["routes"] == ["import"] and report["states"] == ALL_PATCHED


# --- import orders ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "order",
    [TARGETS, tuple(reversed(TARGETS)), ("airflow.models.taskinstance", *TARGETS)],
    ids=["manager-first", "scheduler-first", "via-taskinstance"],
)
def test_targets_are_patched_in_any_import_order_with_one_info_line_per_target(order):
    code = (
        REPORT_CODE
        + "".join(f"\nimport {name}" for name in order)
        + """
import airflow.datasets.manager as m, airflow.jobs.scheduler_job_runner as s
from airflow_dataset_race_fix.fix.datasets.manager import DatasetManager as FixedManager
from airflow_dataset_race_fix.fix.jobs.scheduler_job_runner import SchedulerJobRunner as FixedRunner
_report(
    manager_is_fixed=(
        vars(m.DatasetManager)["_postgres_queue_dagruns"] is vars(FixedManager)["_postgres_queue_dagruns"]
    ),
    runner_is_fixed=(
        s.SchedulerJobRunner._create_dag_runs_dataset_triggered
        is FixedRunner._create_dag_runs_dataset_triggered
    ),
    loader_is_real=(
        type(m.__loader__).__name__ == "SourceFileLoader"
        and type(m.__spec__.loader).__name__ == "SourceFileLoader"
    ),
)
"""
    )
    proc = run_python(code, shim_env())
    report = result(proc)
    assert report["states"] == ALL_PATCHED
    assert report["manager_is_fixed"] and report["runner_is_fixed"] and report["loader_is_real"]
    # the log of the import says, once each and at INFO, which targets this process fixed
    assert sorted(assert_fixed_once(output(proc), *TARGETS)) == sorted(TARGETS)
    assert "other targets" not in output(proc)
    assert count(output(proc), "WARNING") == 0


def test_airflow_imported_before_the_hooks_explicit_import():
    code = (
        REPORT_CODE
        + """
import airflow.datasets.manager, airflow.jobs.scheduler_job_runner
before = {n: __import__("airflow_dataset_race_fix.runtime", fromlist=["x"]).module_state(n).state
          for n in ("airflow.datasets.manager", "airflow.jobs.scheduler_job_runner")}
import airflow_dataset_race_fix.auto
_report(before=before)
"""
    )
    proc = run_python(code, child_env())
    report = result(proc)
    assert report["before"] == ALL_ORIGINAL
    assert report["routes"] == ["import"] and report["states"] == ALL_PATCHED
    assert sorted(assert_fixed_once(output(proc), *TARGETS)) == sorted(TARGETS)


def test_airflow_imported_before_the_hooks_by_a_chained_sitecustomize(tmp_path):
    write_sitecustomize(
        str(tmp_path / "user"), "import airflow.jobs.scheduler_job_runner, airflow.datasets.manager\n"
    )
    proc = run_python(REPORT_CODE + "\n_report()\n", shim_env(str(tmp_path / "user")))
    report = result(proc)
    assert report["airflow_imported"] and report["states"] == ALL_PATCHED


def test_idempotent_and_unapply_restores_the_originals_exactly():
    code = (
        REPORT_CODE
        + """
import airflow.datasets.manager as m, airflow.jobs.scheduler_job_runner as s
from airflow_dataset_race_fix import bootstrap, runtime
from airflow_dataset_race_fix.targets import MEMBERS
owners = {"DatasetManager": m.DatasetManager, "SchedulerJobRunner": s.SchedulerJobRunner}
missing = object()
def snapshot():
    return {mb.qualname: vars(owners[mb.owner]).get(mb.name, missing) for mb in MEMBERS}
original = snapshot()
import airflow_dataset_race_fix.auto
patched = snapshot()
bootstrap.start("import"); bootstrap.start("sitecustomize"); runtime.apply()
again = snapshot()
bootstrap.stop()
restored = snapshot()
_report(
    changed=sorted(k for k in original if original[k] is not patched[k]),
    idempotent=all(patched[k] is again[k] for k in patched),
    restored=all(original[k] is restored[k] for k in original),
    marker_gone=not any(runtime.MARKER in vars(o) for o in owners.values()),
)
"""
    )
    report = result(run_python(code, child_env()))
    assert len(report["changed"]) == len(MEMBERS)  # every member the fix replaces or adds
    assert report["idempotent"] and report["restored"] and report["marker_gone"]


# --- guards -----------------------------------------------------------------------------


def test_unsupported_airflow_version_patches_nothing_and_warns_once(tmp_path):
    write_sitecustomize(str(tmp_path / "user"), UNSUPPORTED_AIRFLOW)
    env = shim_env(str(tmp_path / "user"))
    proc = run_python(
        IMPORT_TARGETS + "\nimport importlib, airflow.datasets.manager as m; importlib.reload(m)\n", env
    )
    report = result(proc)
    assert report["states"] == {name: "refused" for name in TARGETS}
    warnings = [
        line for line in output(proc).splitlines() if "WARNING" in line and "airflow-dataset-race-fix" in line
    ]
    assert len(warnings) == 1, warnings  # one for the process, not repeated by the reload
    for line in warnings:
        assert "the fix is NOT in place: no target module is patched in this process" in line
        assert f"Airflow {UNSUPPORTED_VERSION} is not a supported release" in line  # what was found
        assert "2.10.0 to 2.11.2" in line  # what was expected
        assert "install a supported Airflow" in line  # what to do
    assert count(output(proc), INFO_LINE) == 0

    status = run_status(env)
    assert status.returncode == 1, output(status)
    assert f"Airflow: {UNSUPPORTED_VERSION} (NOT supported" in status.stdout
    assert status.stdout.count(": refused") == 2 and "Fix active: NO" in status.stdout


def test_changed_target_function_is_refused_with_what_was_found(tmp_path):
    write_sitecustomize(str(tmp_path / "user"), OTHER_PATCH)
    env = shim_env(str(tmp_path / "user"))
    code = IMPORT_TARGETS.replace(
        "_report()",
        "import airflow.datasets.manager as m\n"
        "_report(kept=vars(m.DatasetManager)['_postgres_queue_dagruns'].__func__.__module__)",
    )
    proc = run_python(code, env)
    report = result(proc)
    # All or nothing: the scheduler is not patched either (a fixed scheduler beside stock
    # producers strands events).
    assert report["states"] == {name: "refused" for name in TARGETS}
    assert report["kept"] == "sitecustomize"  # the other tool's function is left in place
    warnings = [
        line for line in output(proc).splitlines() if "WARNING" in line and "airflow-dataset-race-fix" in line
    ]
    assert len(warnings) == 1
    assert (
        "no target module is patched in this process, because airflow.datasets.manager was refused"
        in warnings[0]
    )
    assert (
        f"DatasetManager._postgres_queue_dagruns is not the Airflow {AIRFLOW_VERSION} original" in warnings[0]
    )
    assert "expected sha256 8d5f0ab80581" in warnings[0] and "found sha256" in warnings[0]

    status = run_status(env, "--json")
    assert status.returncode == 1
    targets = {t["module"]: t for t in status_json(status)["targets"]}
    assert targets["airflow.datasets.manager"]["status"] == "refused"
    assert f"not the Airflow {AIRFLOW_VERSION} original" in targets["airflow.datasets.manager"]["detail"]
    assert targets["airflow.jobs.scheduler_job_runner"]["status"] == "refused"
    assert (
        "all or nothing and airflow.datasets.manager was refused"
        in targets["airflow.jobs.scheduler_job_runner"]["detail"]
    )


def test_a_target_refused_after_another_was_patched_takes_the_patch_back(tmp_path):
    # The manager is patched (the scheduler's file is pristine then); the scheduler's file
    # changes before its import (another tool, a deploy): the process must not keep a fixed
    # manager beside a stock scheduler.
    site = airflow_shadow(str(tmp_path / "site"))
    code = (
        REPORT_CODE
        + f"""
import airflow.datasets.manager as m
from airflow_dataset_race_fix import runtime
import shim_children
before = runtime.module_state("airflow.datasets.manager").state
shim_children.change_one_byte(
    {site!r}, "airflow/jobs/scheduler_job_runner.py", "_create_dag_runs_dataset_triggered"
)
import airflow.jobs.scheduler_job_runner
from airflow_dataset_race_fix.fix.datasets.manager import DatasetManager as FixedManager
_report(
    before=before,
    manager_fixed=(
        vars(m.DatasetManager)["_postgres_queue_dagruns"] is vars(FixedManager)["_postgres_queue_dagruns"]
    ),
)
"""
    )
    proc = run_python(code, shim_env(site, os.path.dirname(__file__)))
    report = result(proc)
    assert report["before"] == "patched"
    assert report["states"] == {name: "refused" for name in TARGETS}
    assert report["manager_fixed"] is False  # the original is back
    warnings = [
        line for line in output(proc).splitlines() if "WARNING" in line and "airflow-dataset-race-fix" in line
    ]
    assert len(warnings) == 1 and "because airflow.jobs.scheduler_job_runner was refused" in warnings[0], (
        warnings
    )


def test_a_replacement_without_readable_source_is_refused_not_crashed():
    code = (
        REPORT_CODE
        + """
import airflow.datasets.manager as m
m.DatasetManager._slow_path_queue_dagruns = classmethod(eval("lambda cls, *a, **k: None"))
import airflow_dataset_race_fix.auto
_report()
"""
    )
    proc = run_python(code, child_env())
    assert result(proc)["states"]["airflow.datasets.manager"] == "refused"
    assert "whose source cannot be read" in output(proc)


def test_source_already_fixed_keeps_the_shim_idle_and_says_so(tmp_path):
    # What a source patch leaves behind: Airflow's classes already carry the fixed members.
    write_sitecustomize(
        str(tmp_path / "user"),
        """
        import airflow.datasets.manager as m, airflow.jobs.scheduler_job_runner as s
        from airflow_dataset_race_fix.fix.datasets import manager as fm
        from airflow_dataset_race_fix.fix.jobs import scheduler_job_runner as fs
        from airflow_dataset_race_fix.targets import MEMBERS
        for member in MEMBERS:
            fixed_owner = getattr(fm if member.module.endswith("manager") else fs, member.owner)
            owner = getattr(m if member.module.endswith("manager") else s, member.owner)
            setattr(owner, member.name, vars(fixed_owner)[member.name])
    """,
    )
    env = shim_env(str(tmp_path / "user"))
    proc = run_python(IMPORT_TARGETS, env)
    assert result(proc)["states"] == {name: "source-patched" for name in TARGETS}
    assert count(output(proc), "already has the fix, shim idle") == 2  # one line per target
    assert sorted(assert_fixed_once(output(proc), *TARGETS)) == sorted(TARGETS)
    status = run_status(env)
    assert status.returncode == 0 and status.stdout.count("fixed-by-source-patch") == 2, output(status)


# --- switches ---------------------------------------------------------------------------


def test_disable_switch_turns_the_shim_off():
    env = shim_env(switches={"AIRFLOW_DATASET_RACE_FIX_DISABLED": "1"})
    code = IMPORT_TARGETS.replace(
        "_report()",
        "import airflow_dataset_race_fix.auto\n"
        "from airflow_dataset_race_fix.post_import import PostImportFinder\n"
        "_report(finder=any(isinstance(f, PostImportFinder) for f in sys.meta_path))",
    )
    proc = run_python(code, env)
    report = result(proc)
    assert report["disabled"] and not report["started"] and not report["finder"]
    assert report["states"] == ALL_ORIGINAL
    assert count(output(proc), "airflow-dataset-race-fix") == 0

    status = run_status(env)
    assert status.returncode == 1
    assert "disabled by AIRFLOW_DATASET_RACE_FIX_DISABLED" in status.stdout
    assert status.stdout.count("not-fixed") == 2


def test_strict_switch_makes_a_refusal_fail_the_import(tmp_path):
    write_sitecustomize(str(tmp_path / "user"), UNSUPPORTED_AIRFLOW)
    env = shim_env(str(tmp_path / "user"), switches={"AIRFLOW_DATASET_RACE_FIX_STRICT": "1"})
    proc = run_python("import airflow.jobs.scheduler_job_runner\nprint('RESULT {}')", env)
    assert proc.returncode == 1
    assert "RefusedError: airflow-dataset-race-fix (strict)" in proc.stderr
    assert f"Airflow {UNSUPPORTED_VERSION} is not a supported release" in proc.stderr
    assert "RESULT" not in proc.stdout

    status = run_status(env, "--json")
    assert status.returncode == 1
    report = status_json(status)
    assert report["shim"]["strict"] is True
    assert {t["status"] for t in report["targets"]} == {"refused"}


def test_strict_switch_on_a_pristine_airflow_changes_nothing():
    env = shim_env(switches={"AIRFLOW_DATASET_RACE_FIX_STRICT": "1"})
    assert result(run_python(IMPORT_TARGETS, env))["states"] == ALL_PATCHED


def test_a_fix_that_cannot_be_loaded_is_refused_before_any_member_is_replaced(tmp_path):
    # The fixed members are fingerprinted only where the original is not found; on pristine Airflow the
    # fix is loaded (not hashed) before patching, so a fix that fails to import still refuses every target.
    write_sitecustomize(
        str(tmp_path / "user"),
        "import sys\nsys.modules['airflow_dataset_race_fix.fix.datasets.manager'] = None\n",
    )
    code = IMPORT_TARGETS.replace(
        "_report()",
        "import airflow.datasets.manager as m\n"
        "_report(kept=m.DatasetManager.register_dataset_change.__module__)",
    )
    proc = run_python(code, shim_env(str(tmp_path / "user")))
    report = result(proc)
    assert report["states"] == {name: "refused" for name in TARGETS}
    assert report["kept"] == "airflow.datasets.manager"
    assert "the fixed airflow.datasets.manager.DatasetManager.register_dataset_change cannot be loaded" in (
        output(proc)
    )


def test_strict_explicit_import_raises_when_a_target_already_imported_is_refused():
    code = OTHER_PATCH + "\nimport airflow_dataset_race_fix.auto\n"
    proc = run_python(code, child_env(switches={"AIRFLOW_DATASET_RACE_FIX_STRICT": "1"}))
    assert proc.returncode == 1 and "RefusedError" in proc.stderr


# --- status -----------------------------------------------------------------------------


def test_status_with_the_shim_on_pythonpath(tmp_path):
    user = write_sitecustomize(str(tmp_path / "user"), "pass\n")
    status = run_status(shim_env(str(tmp_path / "user")))
    assert status.returncode == 0, output(status)
    text = status.stdout
    assert f"Airflow: {AIRFLOW_VERSION} (supported)" in text
    assert "Shim activated by: PYTHONPATH" in text
    assert "loaded in this process: yes, via sitecustomize" in text
    assert f"chained sitecustomize: {user}" in text
    assert text.count("fixed-by-shim") == 2 and "Fix active: yes" in text


def test_status_json_without_the_shim():
    status = run_status(child_env(), "--json")
    assert status.returncode == 1
    report = json.loads(status.stdout)  # nothing imported Airflow at start: stdout is the document only
    assert report["airflow"]["version"] == AIRFLOW_VERSION and report["airflow"]["supported"] is True
    assert report["shim"]["activated_by"] == [] and report["shim"]["loaded_in_this_process"] is False
    assert [t["status"] for t in report["targets"]] == ["not-fixed", "not-fixed"]
    assert "PYTHONPATH" in report["targets"][0]["detail"] and report["fix_active"] is False


def test_status_no_import_reports_waiting_targets():
    with_shim = run_status(shim_env(), "--no-import", "--json")
    assert with_shim.returncode == 0, output(with_shim)
    assert [t["status"] for t in status_json(with_shim)["targets"]] == ["waiting-for-import"] * 2
    without = run_status(child_env(), "--no-import")
    assert without.returncode == 1 and without.stdout.count("not-fixed") == 2


def test_status_help_is_plain_text():
    proc = subprocess.run(
        [PYTHON, "-m", "airflow_dataset_race_fix", "status", "--help"],
        env=child_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "a .pth file" in proc.stdout and "--no-import)" in proc.stdout
    assert "``" not in proc.stdout and ":func:" not in proc.stdout


def test_status_notices_a_sitecustomize_that_hides_the_shim(tmp_path):
    hiding = write_sitecustomize(str(tmp_path / "first"), "pass\n")
    status = run_status(child_env([str(tmp_path / "first"), BOOTSTRAP_DIR]), "--no-import")
    assert status.returncode == 1
    assert f"its sitecustomize did not run in this process: {hiding} was imported instead" in status.stdout


# --- the .pth route ---------------------------------------------------------------------


@pytest.fixture
def fresh_venv(tmp_path):
    """A new virtualenv that sees the test virtualenv's packages (so nothing is installed
    into, or removed from, the shared one); returns (python, site-packages)."""
    venv = tmp_path / "venv"
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site_packages = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # '00-' sorts before our .pth: site processes .pth files in name order.
    with open(os.path.join(site_packages, "00-adrf-test-link.pth"), "w") as f:
        f.write(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    return python, site_packages


def test_pth_install_activates_and_remove_deactivates(fresh_venv):
    python, site_packages = fresh_venv

    def shim(*args):
        return subprocess.run(
            [python, "-m", "airflow_dataset_race_fix", "shim", *args],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )

    installed = shim("install-pth")
    pth = os.path.join(site_packages, "airflow_dataset_race_fix_shim.pth")
    assert installed.returncode == 0 and f"installed: {pth}" in installed.stdout, output(installed)
    assert "already installed" in shim("install-pth").stdout  # idempotent

    report = result(run_python(IMPORT_TARGETS, child_env(), python=python))
    assert report["routes"] == ["pth"] and report["states"] == ALL_PATCHED
    assert (
        result(run_python(REPORT_CODE + "\n_report()", child_env(), python=python))["airflow_imported"]
        is False
    )

    status = run_status(child_env(), python=python)
    assert status.returncode == 0, output(status)
    assert "Shim activated by: .pth" in status.stdout and f".pth file: {pth}" in status.stdout
    assert "loaded in this process: yes, via pth" in status.stdout

    # Both routes at once: one start, two routes recorded.
    both = result(run_python(IMPORT_TARGETS, shim_env(), python=python))
    assert both["routes"] == ["pth", "sitecustomize"] and both["states"] == ALL_PATCHED

    removed = shim("remove-pth")
    assert removed.returncode == 0 and f"removed: {pth}" in removed.stdout
    assert not os.path.exists(pth)
    report = result(run_python(IMPORT_TARGETS, child_env(), python=python))
    assert report["routes"] == [] and report["states"] == ALL_ORIGINAL
    assert run_status(child_env(), python=python).returncode == 1


@pytest.mark.parametrize("leftover", [False, True], ids=["package-gone", "empty-package-directory-left"])
def test_pth_left_behind_by_an_uninstall_is_silent(fresh_venv, leftover):
    python, site_packages = fresh_venv
    from airflow_dataset_race_fix.activation import PTH_CONTENT

    os.remove(os.path.join(site_packages, "00-adrf-test-link.pth"))  # the package is gone
    if leftover:  # a directory pip did not remove (files written after the install): a namespace package
        os.makedirs(os.path.join(site_packages, "airflow_dataset_race_fix", "__pycache__"))
    with open(os.path.join(site_packages, "airflow_dataset_race_fix_shim.pth"), "w") as f:
        f.write(PTH_CONTENT)
    proc = run_python(
        "import sys; print('ok', 'airflow_dataset_race_fix.bootstrap' in sys.modules)",
        child_env(),
        "-X",
        "dev",
        "-W",
        "error",
        python=python,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "ok False\n", "")


def test_install_pth_says_to_remove_it_before_pip_uninstall(fresh_venv):
    python, site_packages = fresh_venv
    proc = subprocess.run(
        [python, "-m", "airflow_dataset_race_fix", "shim", "install-pth"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, output(proc)
    assert (
        "Before 'pip uninstall airflow-dataset-race-fix', run 'airflow-dataset-race-fix shim remove-pth'"
        in proc.stdout
    )
    with open(os.path.join(site_packages, "airflow_dataset_race_fix_shim.pth")) as f:
        assert "before\n# 'pip uninstall airflow-dataset-race-fix'" in f.read()


# --- the airflow_local_settings and plugin routes (managed platforms) ----------------------


PLUGIN_OPT_IN = {"AIRFLOW__DATASET_RACE_FIX__ENABLE_VIA_PLUGIN": "True"}
PLUGIN_NAME = "airflow_dataset_race_fix"

# The README's airflow_local_settings.py, recording which targets were imported when Airflow ran it.
LOCAL_SETTINGS = f"""
import sys
TARGETS_IMPORTED_BEFORE = [name for name in {TARGETS!r} if name in sys.modules]
""" + readme_local_settings()


def local_settings_home(tmp_path, body: str = LOCAL_SETTINGS) -> dict[str, str]:
    """An AIRFLOW_HOME whose config/ folder holds ``airflow_local_settings.py`` with ``body``."""
    home = tmp_path / "airflow-home"
    (home / "config").mkdir(parents=True)
    (home / "config" / "airflow_local_settings.py").write_text(body)
    return {"AIRFLOW_HOME": str(home)}


def test_airflow_local_settings_turns_the_shim_on_before_any_target_is_imported(tmp_path):
    code = (
        REPORT_CODE
        + """
import airflow, airflow_local_settings
imported_before = airflow_local_settings.TARGETS_IMPORTED_BEFORE
import airflow.datasets.manager, airflow.jobs.scheduler_job_runner
_report(imported_before=imported_before)
"""
    )
    env = child_env(**local_settings_home(tmp_path))
    proc = run_python(code, env)
    report = result(proc)
    assert report["imported_before"] == [], (
        "airflow_local_settings runs inside 'import airflow', before any target"
    )
    assert report["routes"] == ["airflow_local_settings"] and report["states"] == ALL_PATCHED
    assert (
        sorted(assert_fixed_once(output(proc), *TARGETS)) == sorted(TARGETS)
        and count(output(proc), "WARNING") == 0
    )

    status = run_status(env)
    assert status.returncode == 0, output(status)
    assert "Shim activated by: airflow_local_settings" in status.stdout
    assert "loaded in this process: yes, via airflow_local_settings" in status.stdout
    assert "config/airflow_local_settings.py (imports airflow_dataset_race_fix.auto)" in status.stdout
    no_import = run_status(env, "--no-import", "--json")
    assert no_import.returncode == 0, output(no_import)
    assert status_json(no_import)["shim"]["activated_by"] == ["airflow_local_settings"]
    assert [t["status"] for t in status_json(no_import)["targets"]] == ["waiting-for-import"] * 2


def test_strict_airflow_local_settings_makes_a_refused_target_fail_its_import(tmp_path):
    # Airflow imports airflow_local_settings first (the hooks start), then the user's
    # sitecustomize reports an unsupported release, then the target's import raises.
    write_sitecustomize(str(tmp_path / "user"), UNSUPPORTED_AIRFLOW)
    env = child_env(
        [str(tmp_path / "user")],
        switches={"AIRFLOW_DATASET_RACE_FIX_STRICT": "1"},
        **local_settings_home(tmp_path),
    )
    proc = run_python("import airflow.jobs.scheduler_job_runner\nprint('RESULT {}')", env)
    assert proc.returncode == 1 and "RESULT" not in proc.stdout, output(proc)[-3000:]
    assert "RefusedError: airflow-dataset-race-fix (strict)" in proc.stderr
    assert f"Airflow {UNSUPPORTED_VERSION} is not a supported release" in proc.stderr


def test_airflow_local_settings_without_the_package_leaves_airflow_working_and_says_so(tmp_path):
    # The package missing (a failed requirements install): the README's file must not stop Airflow.
    code = (
        REPORT_CODE.replace("def _report", "sys.modules['airflow_dataset_race_fix.auto'] = None\ndef _report")
        + """
import airflow.datasets.manager, airflow.jobs.scheduler_job_runner
_report()
"""
    )
    proc = run_python(code, child_env(**local_settings_home(tmp_path)))
    report = result(proc)
    assert report["states"] == ALL_ORIGINAL and report["routes"] == []
    assert "airflow-dataset-race-fix: the fix is NOT in place: " in proc.stderr, output(proc)[-3000:]


def test_status_tells_an_airflow_local_settings_that_does_not_import_the_fix(tmp_path):
    env = child_env(**local_settings_home(tmp_path, "# import airflow_dataset_race_fix.auto\n"))
    status = run_status(env)
    assert status.returncode == 1
    assert "Shim activated by: nothing (not activated)" in status.stdout
    assert "config/airflow_local_settings.py (does not import airflow_dataset_race_fix.auto)" in status.stdout


LOAD_PLUGINS = (
    REPORT_CODE
    + """
import airflow.datasets.manager, airflow.jobs.scheduler_job_runner
from airflow_dataset_race_fix import runtime
before = {
    name: runtime.module_state(name).state
    for name in ("airflow.datasets.manager", "airflow.jobs.scheduler_job_runner")
}
from airflow import plugins_manager
plugins_manager.ensure_plugins_loaded()
_report(
    before=before,
    plugins=[plugin.name for plugin in plugins_manager.plugins],
    plugin_errors=dict(plugins_manager.import_errors),
    entry_point_loaded="airflow_dataset_race_fix.plugin" in sys.modules,
)
"""
)


@pytest.mark.parametrize("opt_in", [None, "False"], ids=["unset", "False"])
def test_the_installed_plugin_entry_point_changes_nothing_without_the_opt_in(opt_in):
    extra = {} if opt_in is None else {"AIRFLOW__DATASET_RACE_FIX__ENABLE_VIA_PLUGIN": opt_in}
    proc = run_python(LOAD_PLUGINS, child_env(**extra))
    report = result(proc)
    assert report["entry_point_loaded"], "Airflow loaded the entry point"
    assert report["states"] == ALL_ORIGINAL and report["routes"] == [] and not report["started"]
    assert PLUGIN_NAME not in report["plugins"] and report["plugin_errors"] == {}
    assert count(output(proc), "airflow-dataset-race-fix") == 0


def test_the_plugin_route_with_the_opt_in_in_airflow_cfg(tmp_path):
    config = tmp_path / "airflow.cfg"
    config.write_text("[dataset_race_fix]\nenable_via_plugin = True\n")
    proc = run_python(LOAD_PLUGINS, child_env(AIRFLOW_CONFIG=str(config)))
    report = result(proc)
    assert report["before"] == ALL_ORIGINAL and report["states"] == ALL_PATCHED
    assert report["routes"] == ["plugin"] and PLUGIN_NAME in report["plugins"]
    assert (
        sorted(assert_fixed_once(output(proc), *TARGETS)) == sorted(TARGETS)
        and count(output(proc), "WARNING") == 0
    )


@pytest.mark.parametrize("where", ["AIRFLOW_HOME", "AIRFLOW_CONFIG"])
def test_status_no_import_reads_the_opt_in_from_airflow_cfg_as_status_does(tmp_path, where):
    """A Dockerfile's 'RUN ... status --no-import' with the opt-in in airflow.cfg (issue 31):
    the same verdict as plain 'status', without importing Airflow."""
    config = tmp_path / "airflow.cfg"
    config.write_text(
        "[core]\nload_examples = False\n\n[dataset_race_fix]\nenable_via_plugin = True  # the opt-in\n"
    )
    env = child_env(
        **({"AIRFLOW_HOME": str(tmp_path)} if where == "AIRFLOW_HOME" else {"AIRFLOW_CONFIG": str(config)})
    )
    env.pop("AIRFLOW__DATASET_RACE_FIX__ENABLE_VIA_PLUGIN", None)
    status = run_status(env)
    assert status.returncode == 0 and "Shim activated by: plugin" in status.stdout, output(status)
    no_import = run_status(env, "--no-import")
    assert no_import.returncode == 0, output(no_import)
    assert "Shim activated by: plugin" in no_import.stdout
    assert f"enable_via_plugin: on (read from {config})" in no_import.stdout
    assert no_import.stdout.count("waiting-for-import") == 2 and "not-fixed" not in no_import.stdout
    # the environment variable wins over airflow.cfg, in Airflow and here
    off = run_status({**env, "AIRFLOW__DATASET_RACE_FIX__ENABLE_VIA_PLUGIN": "False"}, "--no-import")
    assert off.returncode == 1 and "enable_via_plugin: off" in off.stdout, output(off)
    config.write_text("[dataset_race_fix]\nenable_via_plugin = False\n")
    assert run_status(env, "--no-import").returncode == 1


def test_the_plugin_route_with_the_opt_in_in_the_environment_and_status():
    env = child_env(**PLUGIN_OPT_IN)
    report = result(run_python(LOAD_PLUGINS, env))
    assert report["routes"] == ["plugin"] and report["states"] == ALL_PATCHED

    status = run_status(env)
    assert status.returncode == 0, output(status)
    assert "Shim activated by: plugin" in status.stdout
    assert "loaded in this process: yes, via plugin" in status.stdout
    assert "enable_via_plugin: on (read from Airflow's configuration)" in status.stdout
    no_import = run_status(env, "--no-import")
    assert no_import.returncode == 0 and no_import.stdout.count("waiting-for-import") == 2, output(no_import)
    off = run_status(child_env(AIRFLOW__DATASET_RACE_FIX__ENABLE_VIA_PLUGIN="False"))
    assert off.returncode == 1 and "enable_via_plugin: off" in off.stdout


def test_an_opt_in_that_is_not_a_boolean_leaves_the_process_stock_and_says_so():
    proc = run_python(LOAD_PLUGINS, child_env(AIRFLOW__DATASET_RACE_FIX__ENABLE_VIA_PLUGIN="yes please"))
    report = result(proc)
    assert report["states"] == ALL_ORIGINAL and PLUGIN_NAME not in report["plugins"]
    warnings = [
        line for line in output(proc).splitlines() if "WARNING" in line and "airflow-dataset-race-fix" in line
    ]
    assert len(warnings) == 1 and "the plugin route failed (AirflowConfigException" in warnings[0], output(
        proc
    )[-3000:]


def test_the_disable_switch_wins_over_the_plugin_opt_in():
    env = child_env(switches={"AIRFLOW_DATASET_RACE_FIX_DISABLED": "1"}, **PLUGIN_OPT_IN)
    proc = run_python(LOAD_PLUGINS, env)
    report = result(proc)
    assert report["disabled"] and not report["started"] and report["states"] == ALL_ORIGINAL
    assert count(output(proc), "airflow-dataset-race-fix") == 0


@pytest.mark.parametrize("strict", [False, True], ids=["warn", "strict"])
def test_the_plugin_route_refuses_a_changed_target_all_or_nothing(strict):
    switches = {"AIRFLOW_DATASET_RACE_FIX_STRICT": "1"} if strict else {}
    proc = run_python(OTHER_PATCH + LOAD_PLUGINS, child_env(switches=switches, **PLUGIN_OPT_IN))
    if strict:
        # The plugin manager swallows a plugin's exceptions: strict mode exits instead.
        assert proc.returncode == 1 and "RESULT" not in proc.stdout, output(proc)[-3000:]
        assert "airflow-dataset-race-fix (strict): airflow.datasets.manager refused" in proc.stderr
        return
    report = result(proc)
    assert report["states"] == {name: "refused" for name in TARGETS}
    warnings = [
        line for line in output(proc).splitlines() if "WARNING" in line and "airflow-dataset-race-fix" in line
    ]
    assert len(warnings) == 1 and "DatasetManager._postgres_queue_dagruns is not the Airflow" in warnings[0]


# A program that registers a dataset event without having loaded Airflow's plugins: the
# listener hook inside register_dataset_change loads them, in the middle of that call.
MID_CALL = (
    REPORT_CODE
    + """
from sqlalchemy import func, select
from airflow.datasets import Dataset
from airflow.datasets.manager import DatasetManager
from airflow.models.dataset import DatasetEvent, DatasetModel
from airflow.utils.session import create_session

URI = "adrf://plugin-route/mid-call"

def events():
    with create_session() as session:
        dataset_id = session.scalar(select(DatasetModel.id).where(DatasetModel.uri == URI))
        return session.scalar(
            select(func.count()).select_from(DatasetEvent).where(DatasetEvent.dataset_id == dataset_id)
        )

with create_session() as session:
    if session.scalar(select(DatasetModel.id).where(DatasetModel.uri == URI)) is None:
        session.add(DatasetModel(uri=URI))
before = events()
try:
    with create_session() as session:
        DatasetManager.register_dataset_change(dataset=Dataset(URI), session=session)
finally:
    _report(new_events=events() - before)
"""
)


@pytest.mark.parametrize("strict", [False, True], ids=["warn", "strict"])
def test_plugins_loaded_during_a_targeted_call_leave_the_process_stock(strict):
    switches = {"AIRFLOW_DATASET_RACE_FIX_STRICT": "1"} if strict else {}
    proc = run_python(MID_CALL, child_env(switches=switches, **PLUGIN_OPT_IN))
    text = output(proc)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, text[-3000:]
    report = json.loads(lines[-1][len("RESULT ") :])
    assert "DatasetManager.register_dataset_change was already running" in text, text[-3000:]
    assert report["states"] == {name: "refused" for name in TARGETS}
    if strict:
        assert proc.returncode == 1 and report["new_events"] == 0, (
            "strict: the process exits, the event is not committed"
        )
    else:
        assert proc.returncode == 0 and report["new_events"] == 1, "the stock call finishes, wholly stock"
        assert count(text, "WARNING") == 1 and count(text, INFO_LINE) == 0


@pytest.mark.parametrize(
    "argv,level",
    [
        (["/venv/bin/airflow", "dags", "list"], "DEBUG"),
        (["/venv/bin/airflow", "db", "migrate"], "DEBUG"),
        (["/venv/bin/airflow", "tasks", "state", "d", "t"], "DEBUG"),
        (["/venv/bin/airflow", "scheduler"], "INFO"),
        (["/venv/bin/airflow", "celery", "worker", "-q", "default"], "INFO"),
        (["/venv/bin/airflow", "tasks", "run", "--raw", "d", "t", "run_id"], "INFO"),
        (["/venv/lib/python3.11/site-packages/airflow/__main__.py", "triggerer"], "INFO"),
        (["/venv/lib/python3.11/site-packages/airflow/__main__.py", "version"], "DEBUG"),
        (["/venv/bin/celery", "worker"], "INFO"),  # not the airflow CLI: a program of its own
        (["-c"], "INFO"),
    ],
)
def test_fix_in_place_is_logged_at_info_only_by_long_running_processes(monkeypatch, argv, level):
    import logging
    import sys

    from airflow_dataset_race_fix import runtime

    monkeypatch.setattr(sys, "argv", argv)
    assert logging.getLevelName(runtime.announce_level()) == level


def test_shim_cli_rejects_a_missing_site_dir(tmp_path):
    proc = subprocess.run(
        [
            PYTHON,
            "-m",
            "airflow_dataset_race_fix",
            "shim",
            "install-pth",
            "--site-dir",
            str(tmp_path / "nope"),
        ],
        env=child_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "is not a directory" in proc.stderr


def test_shim_path_prints_the_bootstrap_directory():
    proc = subprocess.run(
        [PYTHON, "-m", "airflow_dataset_race_fix", "shim", "path"],
        env=child_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == BOOTSTRAP_DIR


# A Python whose SQLite library predates upsert (3.24.0); Airflow 2.10 accepts 3.15.0.
OLD_SQLITE = """
import sqlite3
sqlite3.sqlite_version_info, sqlite3.sqlite_version = (3, 22, 0), "3.22.0"
"""


def test_sqlite_without_upsert_is_refused_clearly(tmp_path, backend):
    write_sitecustomize(str(tmp_path / "user"), OLD_SQLITE)
    env = shim_env(str(tmp_path / "user"))
    proc = run_python(IMPORT_TARGETS, env)
    report = result(proc)
    if backend != "sqlite":  # the library does not matter on a server database
        assert report["states"] == ALL_PATCHED
        return
    assert report["states"] == {name: "refused" for name in TARGETS}
    warnings = [
        line for line in output(proc).splitlines() if "WARNING" in line and "airflow-dataset-race-fix" in line
    ]
    assert warnings and all("SQLite library is 3.22.0, which has no upsert" in line for line in warnings)
    status = run_status(env)
    assert status.returncode == 1 and "no upsert" in output(status)


# --- other interpreters that inherit PYTHONPATH ---------------------------------------------

OLD_PYTHONS = [
    os.path.expanduser(f"~/.pyenv/versions/{v}/bin/python") for v in ("2.7.18", "3.6.15", "3.7.16")
]


@pytest.mark.parametrize("python", OLD_PYTHONS, ids=lambda path: path.split("/")[-3])
def test_the_bootstrap_is_silent_on_a_python_this_package_does_not_run_on(python, tmp_path):
    if not os.path.exists(python):
        pytest.skip(f"{python} is not installed")
    src = os.path.dirname(os.path.dirname(BOOTSTRAP_DIR))  # even with this package importable
    alone = run_python("print('ok')", child_env([BOOTSTRAP_DIR, src]), python=python)
    assert (alone.returncode, alone.stdout, alone.stderr) == (0, "ok\n", "")
    write_sitecustomize(str(tmp_path / "user"), "import sys; sys.stdout.write('USER\\n')\n")
    chained = run_python("print('ok')", child_env([BOOTSTRAP_DIR, str(tmp_path / "user")]), python=python)
    assert (chained.returncode, chained.stdout, chained.stderr) == (0, "USER\nok\n", "")


def test_the_bootstrap_minimum_python_is_the_package_s():
    import configparser

    from airflow_dataset_race_fix._bootstrap import sitecustomize

    setup = configparser.ConfigParser()
    setup.read(os.path.join(os.path.dirname(os.path.dirname(__file__)), "setup.cfg"))
    minimum = setup["options"]["python_requires"].removeprefix(">=")
    assert ".".join(map(str, sitecustomize.MIN_PYTHON)) == minimum
