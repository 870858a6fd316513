"""
Run real Python interpreters (the test virtualenv's) with or without the start-up shim.

Children inherit the test session's Airflow environment (AIRFLOW_HOME, the scratch
database) but never the caller's PYTHONPATH or our switches: each test says exactly
which route and switches its child gets. A child reports by printing one line
``RESULT <json>`` on stdout; Airflow's own logging also goes to stdout, so
:func:`result` picks that line out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterable

from airflow_dataset_race_fix import BOOTSTRAP_DIR
from airflow_dataset_race_fix.bootstrap import SWITCHES

PYTHON = sys.executable
INFO_LINE = "airflow-dataset-race-fix: fix in place"
WARNING_MARK = "airflow-dataset-race-fix: "

# Child code that prints what the shim did, as JSON, on one RESULT line.
REPORT_CODE = """
import json, sys
def _report(**extra):
    from airflow_dataset_race_fix import bootstrap, runtime
    from airflow_dataset_race_fix.targets import TARGET_MODULES
    states = {name: runtime.module_state(name).state for name in TARGET_MODULES}
    print("RESULT " + json.dumps(dict(
        airflow_imported="airflow" in sys.modules,
        routes=bootstrap.routes,
        started=bootstrap.started,
        disabled=bootstrap.disabled,
        chained=bootstrap.chained_sitecustomize,
        states=states,
        **extra,
    )), flush=True)
"""

TARGETS = ("airflow.datasets.manager", "airflow.jobs.scheduler_job_runner")
ALL_PATCHED = {name: "patched" for name in TARGETS}
ALL_ORIGINAL = {name: "patchable" for name in TARGETS}
# Child code that imports both targets and reports.
IMPORT_TARGETS = (
    REPORT_CODE
    + """
import airflow.datasets.manager, airflow.jobs.scheduler_job_runner
_report()
"""
)


def child_env(
    pythonpath: Iterable[str] = (),
    switches: dict[str, str] | None = None,
    log_level: str = "INFO",
    **extra: str,
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and k not in SWITCHES}
    env.update(switches or {})
    env["AIRFLOW__LOGGING__LOGGING_LEVEL"] = log_level
    env.update(extra)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    return env


def shim_env(*more_path: str, **kwargs) -> dict[str, str]:
    """The PYTHONPATH route: the bootstrap directory first, then ``more_path``."""
    return child_env([BOOTSTRAP_DIR, *more_path], **kwargs)


def run_python(
    code: str, env: dict[str, str], *python_args: str, python: str = PYTHON, timeout: float = 180
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, *python_args, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_status(env: dict[str, str], *args: str, python: str = PYTHON) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, "-m", "airflow_dataset_race_fix", "status", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def result(proc: subprocess.CompletedProcess) -> dict:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"child failed (exit {proc.returncode}):\n{output(proc)[-4000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


def status_json(proc: subprocess.CompletedProcess) -> dict:
    """The JSON document of ``status --json``. Log lines can precede it when a sitecustomize
    imports Airflow at start-up (Airflow logs to stdout), before ``status`` runs."""
    lines = proc.stdout.splitlines()
    return json.loads("\n".join(lines[lines.index("{") :]))


def output(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


def count(text: str, needle: str) -> int:
    return sum(1 for line in text.splitlines() if needle in line)


def fixed_targets(text: str, level: str = "INFO") -> list[str]:
    """The target modules named by the "fix in place" lines of ``text`` logged at ``level``,
    in order; a target named twice appears twice."""
    import re

    return [
        match[1]
        for line in text.splitlines()
        if level in line and (match := re.search(re.escape(INFO_LINE) + r" \(([\w.]+): ", line))
    ]


def assert_fixed_once(text: str, *expected: str) -> list[str]:
    """Each "fix in place" INFO line names one target, no target twice, and at least the
    ``expected`` ones (a process imports only the targets it uses); the targets named."""
    named = fixed_targets(text)
    assert count(text, INFO_LINE) == len(named) >= max(1, len(expected)), text[-3000:]
    assert len(set(named)) == len(named), f"a target announced twice: {named}\n{text[-3000:]}"
    assert set(expected) <= set(named), f"expected {expected} among {named}\n{text[-3000:]}"
    return named


def readme_local_settings() -> str:
    """The README's ``airflow_local_settings.py`` ("Turn it on"), as an operator copies it."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(r"```python\n( *# airflow_local_settings\.py.*?)```", readme, re.S)
    assert block, "README: the airflow_local_settings.py block of 'Turn it on'"
    return textwrap.dedent(block[1])


def write_sitecustomize(directory: str, body: str) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "sitecustomize.py")
    with open(path, "w") as f:
        f.write(textwrap.dedent(body))
    return path


def airflow_shadow(root: str) -> str:
    """A directory to put first on PYTHONPATH (or to pass as ``--site-packages``) whose
    ``airflow`` package and dist-info are trees of symlinks to this virtualenv's. A test
    changes a file there by replacing its link; the installed Airflow is never touched."""
    import airflow_dataset_race_fix.source_patches.record as record

    installed = record.default_site_packages()
    dist_info = record.installed_airflow(installed).dist_info
    for source in (installed / "airflow", dist_info):
        for directory, subdirectories, files in os.walk(source):
            subdirectories[:] = [d for d in subdirectories if d != "__pycache__"]
            mirror = os.path.join(root, os.path.relpath(directory, installed))
            os.makedirs(mirror, exist_ok=True)
            for name in files:
                os.symlink(os.path.join(directory, name), os.path.join(mirror, name))
    return root


def change_one_byte(site: str, relative_path: str, member: str) -> None:
    """Replace the link ``site/relative_path`` by a copy with one byte changed in ``member``."""
    path = os.path.join(site, relative_path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    at = text.index("dag_id", text.index(f"def {member}(")) + len("dag_i")
    os.unlink(path)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text[:at] + "D" + text[at + 1 :])
