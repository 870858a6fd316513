"""
The install works as an operator would do it: `airflow version` and `airflow db migrate`
for the Airflow release installed here (tox: one env per release and Python), installed
from its pins for this Python in requirements/; and the README's quick start, word for
word, in a fresh virtualenv outside the repository.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import pytest
from conftest import AIRFLOW_VERSION, BACKEND
from matrix import ON_FULL_RELEASES_ONLY

from reproduce.harness.database import ScratchDatabase

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
    assert PINS.is_file(), (
        f"no pins for the installed apache-airflow {AIRFLOW_VERSION} on Python {PYTHON}: {PINS}"
    )
    pins = _pins()
    assert pins["apache-airflow"] == AIRFLOW_VERSION
    installed = {
        re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version for d in metadata.distributions()
    }
    differ = {
        name: (pinned, installed[name])
        for name, pinned in pins.items()
        if installed.get(name, pinned) != pinned
    }
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


@ON_FULL_RELEASES_ONLY
def test_a_test_session_leaves_no_airflow_home_behind(tmp_path):
    """conftest's AIRFLOW_HOME (logs, airflow.cfg) goes with the session that made it."""
    env = dict(os.environ, TMPDIR=str(tmp_path))
    session = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:randomly",
            "tests/test_readme.py::test_the_readme_shows_commands",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert session.returncode == 0, session.stdout[-2000:] + session.stderr[-2000:]
    assert not list(tmp_path.glob("adrf-airflow-home-*")), sorted(p.name for p in tmp_path.iterdir())


def _quick_start_script(repo: Path) -> str:
    """The README's quick start as a bash script for a clone at ``repo``: the database migrated
    before ``status``, and each of ``status``, ``audit``, ``explain`` and ``deployment`` followed by its
    exit code."""
    from test_readme import quick_start_commands

    lines = ["set -euo pipefail"]
    for command in quick_start_commands():
        if command.startswith("ADRF="):
            command = f"ADRF={shlex.quote(str(repo))}"
        if command.endswith(" status"):
            lines += ["airflow db migrate >/dev/null", "set +e"]
        if command.endswith((" status", " audit", " deployment")):
            command += f'; echo "exit of {command.split()[-1]}: $?"'
        if " explain " in command:  # DAG_ID is the reader's: in this empty database, exit 2 naming it
            command += '; echo "exit of explain: $?"'
        lines.append(command)
    return "\n".join(lines) + "\n"


@pytest.mark.skipif(
    (BACKEND, AIRFLOW_VERSION, PYTHON) != ("sqlite", "2.10.4", "3.11"),
    reason="installs Airflow into a fresh virtualenv (about a minute from pip's cache): "
    "run once, in the env of the quick start's release on SQLite",
)
def test_quick_start_install_outside_the_repository(tmp_path):
    """The README's quick start, word for word, in an existing Airflow deployment (a virtualenv
    with Airflow and one package at a version of its own, not ours) and a directory outside
    the repository, on a PATH without ``python`` (Debian without a virtualenv has only
    ``python3``): the wheel builds and installs alone, so that no package of the deployment
    moves; ``status`` and ``audit`` run against a migrated SQLite database, neither needs the
    reproduction-only time-machine, and ``apply --help`` names the patches the wheel installed."""
    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True, timeout=120)
    home = tmp_path / "airflow-home"
    home.mkdir()
    no_python = tmp_path / "no-python"  # first on PATH: 'python' is not there, as on Debian
    no_python.mkdir()
    (no_python / "python").write_text("#!/bin/sh\necho 'python: command not found' >&2\nexit 127\n")
    (no_python / "python").chmod(0o755)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("AIRFLOW", "PYTHON", "VIRTUAL_ENV", "PIP_CONSTRAINT"))
    }
    env.update(
        PATH=f"{no_python}{os.pathsep}{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
    )
    # The deployment: Airflow (from our pins, for speed: pip's cache has them), and six at a
    # version of its own (our pins say 1.17.0; python-dateutil takes any six >= 1.5).
    python = str(venv / "bin" / "python")
    for requirements in (["-c", str(PINS), f"apache-airflow=={AIRFLOW_VERSION}"], ["six==1.16.0"]):
        deployed = subprocess.run(
            [python, "-m", "pip", "install", "-q", *requirements],
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
        )
        assert deployed.returncode == 0, deployed.stderr[-3000:]

    def freeze() -> set[str]:
        return set(
            subprocess.run(
                [python, "-m", "pip", "freeze", "--all"],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            ).stdout.splitlines()
        )

    before = freeze()
    assert "six==1.16.0" in before
    clone = _clone(tmp_path)
    script = _quick_start_script(clone)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    started = time.monotonic()
    run = subprocess.run(
        ["bash", "-c", script], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=1200
    )
    print(f"quick start in a fresh virtualenv: {time.monotonic() - started:.0f} s")
    output = run.stdout + run.stderr
    assert run.returncode == 0, f"{script}\n{output[-4000:]}"
    assert "exit of status: 0" in run.stdout, output[-4000:]
    assert "exit of audit: 0" in run.stdout, output[-4000:]
    assert "exit of deployment: 0" in run.stdout and "Every process seen ran the fix" in run.stdout, output[
        -4000:
    ]
    assert "exit of explain: 2" in run.stdout and "no DAG 'DAG_ID' in the metadata database" in output, (
        output[-4000:]
    )
    assert "Traceback" not in output, output[-4000:]
    after = freeze()
    added = after - before
    assert (
        before - after == set()
        and len(added) == 1
        and next(iter(added)).startswith("airflow-dataset-race-fix")
    ), f"the quick start moved packages of the deployment: gone {sorted(before - after)}, new {sorted(added)}"
    # apply's default patches directory, from a wheel: the copy it installed
    apply_help = subprocess.run(
        [str(venv / "bin" / "airflow-dataset-race-fix"), "apply", "--help"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    installed_patches = (
        Path(_run(python, "-c", "import airflow_dataset_race_fix as p; print(p.__path__[0])")) / "patches"
    )
    assert (installed_patches / "series").is_file()  # the one series, for every release
    # wrapped lines joined
    assert str(installed_patches) in "".join(apply_help.stdout.split()), apply_help.stdout
    # time-machine is only the [reproduce] extra's. (Airflow's pendulum 3 requires it on CPython
    # anyway, so it is installed here; what matters is that this package neither requires nor
    # imports it outside the reproduction harness.)
    requires = subprocess.run(
        [
            python,
            "-c",
            "import json; from importlib import metadata; "
            "print(json.dumps(metadata.requires('airflow-dataset-race-fix')))",
        ],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    time_machine = [r for r in json.loads(requires) if r.startswith("time-machine")]
    assert any('extra == "reproduce"' in r for r in time_machine), requires
    assert all("extra ==" in r for r in time_machine), f"time-machine must be an extra's only: {requires}"
    for command in ("status", "audit"):
        without = subprocess.run(
            [
                python,
                "-c",
                "import sys; sys.modules['time_machine'] = None; "
                "from airflow_dataset_race_fix.cli import main; sys.exit(main([sys.argv[1]]))",
                command,
            ],
            cwd=elsewhere,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert without.returncode in (0, 1) and "Traceback" not in without.stderr, without.stderr[-3000:]


def _clone(tmp_path: Path) -> Path:
    """A copy of the tracked files to build from, so that a test neither writes into this
    worktree nor depends on its build leftovers."""
    clone = tmp_path / "clone"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
    return clone


def _run(*command: str, cwd=None) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout.strip()


@pytest.mark.skipif(BACKEND != "sqlite", reason="pip and a virtualenv, no database: run in the -sqlite envs")
def test_install_then_uninstall_leaves_nothing_behind(tmp_path):
    """Issue 50: the wheel alone, with real pip in a fresh virtualenv: every file and directory it
    installs (the source patches' series too, where ``apply`` finds it) goes with ``pip uninstall``."""
    clone, venv = _clone(tmp_path), tmp_path / "venv"
    _run(sys._base_executable, "-m", "venv", str(venv))
    python = str(venv / "bin" / "python")
    _run(
        python,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "-w",
        str(tmp_path / "dist"),
        str(clone),
        cwd=tmp_path,
    )
    before = {str(p.relative_to(venv)) for p in venv.rglob("*") if "__pycache__" not in p.parts}
    (wheel,) = (tmp_path / "dist").glob("airflow_dataset_race_fix-*.whl")
    _run(python, "-m", "pip", "install", "-q", "--no-deps", str(wheel))
    found = _run(
        python,
        "-c",
        "from airflow_dataset_race_fix.source_patches import locations as l; print(l.default_patches_dir())",
        cwd=tmp_path,
    )
    assert Path(found, "series").is_file() and Path(found).is_relative_to(venv), found
    _run(python, "-m", "pip", "uninstall", "-q", "-y", "airflow-dataset-race-fix")
    after = {str(p.relative_to(venv)) for p in venv.rglob("*") if "__pycache__" not in p.parts}
    assert after == before, f"left behind: {sorted(after - before)}; gone: {sorted(before - after)}"


def _expand(name: str) -> list[str]:
    """tox's generative names: 'py{39,310}-a' -> ['py39-a', 'py310-a']."""
    brace = re.search(r"\{([^{}]*)\}", name)
    if not brace:
        return [name]
    return [
        n
        for alt in brace.group(1).split(",")
        for n in _expand(name[: brace.start()] + alt + name[brace.end() :])
    ]


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
