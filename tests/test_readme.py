"""The README (and docs/) cannot rot: every command shown parses, runs here, or is run by CI."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from matrix import ON_SQLITE_ONLY

from airflow_dataset_race_fix import __version__
from airflow_dataset_race_fix.cli import build_parser

pytestmark = ON_SQLITE_ONLY

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BEHAVIOUR = REPO / "docs" / "behaviour.md"  # the README's "Behaviour that differs from stock Airflow", moved
# The README and the documents it links to under docs/: their commands are held to the same rule.
DOCUMENTS = [README, *sorted((REPO / "docs").glob("*.md"))]
CLI = "airflow-dataset-race-fix"

# Commands that are not ours, and what runs them: a README line must start with one of
# these or be one of our CLI's commands (which test_cli_commands_parse checks).
EXERCISED_ELSEWHERE = {
    "reproduce/run": "test_reproduce_run_script_starts (and the reproduction tests)",
    "python -m reproduce": "tests/test_reproduce.py runs every reproduction that way",
    ".ci/run": "CI itself",
    "ADRF=": "test_install.py's test_quick_start_install_outside_the_repository sets it",
    "python3 -m pip wheel": "test_install.py's test_quick_start_install_outside_the_repository",
    "pip install": "the quick start's: test_install.py; the others: .ci/run and tox install the same way",
    "tox": ".ci/run runs tox; tox -e <env> -- <args> is tox's own syntax",
    "pg_ctlcluster": ".ci/run starts PostgreSQL with it",
    "start-stop-daemon": ".ci/run starts MariaDB with it",
    "apt-get install": ".ci/run installs the same packages",
    "export PYTHONPATH=": "tests/test_shim.py runs Python and Airflow with the shim on PYTHONPATH",
    "python reproduce/bench.py": "test_bench_script_starts",
    "SP=": (
        "docs/source-patches.md's plain-patch loop sets it: "
        "test_source_patches.py applies the series with plain patch -p1"
    ),
    "for p in $(grep -v '^#' patches/": (
        "test_source_patches.py's test_plain_patch_takes_the_series_one_file_at_a_time"
    ),
    "ruff ": ".ci/run runs ruff format --check and ruff check on these paths (requirements/lint.txt's pin)",
    "python -m tests.explorer": (
        "test_explorer.py's test_the_command_line_replays_a_step_list (and the exploration itself)"
    ),
}


def _readme_commands() -> list[str]:
    """Shell commands in the bash and Dockerfile blocks of DOCUMENTS, continuations joined."""
    commands: list[str] = []
    documents = "\n".join(document.read_text() for document in DOCUMENTS)
    for lang, body in re.findall(r"```(bash|dockerfile)\n(.*?)```", documents, re.S):
        text = body.replace("\\\n", " ")
        for line in text.splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if lang == "dockerfile":
                if not line.startswith("RUN "):
                    continue
                commands.extend(part.strip() for part in line[4:].split("&&"))
            elif line and not line.startswith("#"):
                commands.append(line)
    return commands


def _our_argv(command: str) -> list[str] | None:
    """argv of our CLI in ``command`` (after any VAR=value prefix), or None."""
    words = shlex.split(re.sub(r"\$\([^)]*\)", "X", command))
    while words and re.match(r"^[A-Z_]+=", words[0]):
        words.pop(0)
    if words and words[0] == CLI:
        return words[1:]
    return None


def quick_start_commands() -> list[str]:
    """The commands of the README's quick start block, continuations joined, comments dropped."""
    section = README.read_text().split("## Quick start\n", 1)[1].split("\n## ", 1)[0]
    body = re.search(r"```bash\n(.*?)```", section, re.S)[1].replace("\\\n", " ")
    return [re.sub(r"\s+#\s.*$", "", line).strip() for line in body.splitlines() if line.strip()]


def test_the_quick_start_installs_turns_on_checks_and_audits():
    commands = quick_start_commands()
    assert commands[0].startswith("ADRF=/")
    wheel = f"airflow_dataset_race_fix-{__version__}-py3-none-any.whl"
    installs = [c for c in commands if c.startswith("pip install")]
    # It is for the environment where Airflow runs: the wheel alone, so that nothing of that
    # deployment moves to our pins (issue 31: they moved cryptography and packaging).
    assert installs == [f'pip install --no-deps "$ADRF/dist/{wheel}"'], (
        f"the quick start installs the wheel this version builds ({wheel}) alone, "
        f"by absolute path: {installs}"
    )
    assert not any("constraints-" in c or "apache-airflow" in c for c in commands)
    # Debian without a virtualenv has python3 but no python
    assert not [c for c in commands if shlex.split(c)[0] == "python"], commands
    assert any("shim path" in c for c in commands)
    assert f"{CLI} status" in commands and f"{CLI} audit" in commands
    section = README.read_text().split("## Quick start\n", 1)[1].split("\n## ", 1)[0]
    assert "AIRFLOW_DATASET_RACE_FIX_DISABLED=1" in section, "the quick start says how to turn the fix off"
    assert "`--no-deps`" in section and "**new** environment" in section and "(#install)" in section, (
        "where the command stands, the README says which install is for which environment"
    )
    assert len(section.splitlines()) <= 45, "the quick start fits on one screen"


def test_the_readme_shows_commands():
    commands = _readme_commands()
    assert len(commands) > 20
    assert any(c.startswith("reproduce/run") for c in commands)
    assert any(c.startswith(".ci/run") for c in commands)


@pytest.mark.parametrize("command", _readme_commands())
def test_every_readme_command_is_ours_or_exercised_elsewhere(command):
    argv = _our_argv(command)
    if argv is None:
        assert any(command.startswith(prefix) for prefix in EXERCISED_ELSEWHERE), (
            f"README command {command!r} is neither ours nor known to be run by a test or CI: "
            "add a test, or name what runs it in EXERCISED_ELSEWHERE"
        )
        return
    try:
        build_parser().parse_args(argv)
    except SystemExit as exit:
        pytest.fail(f"README command {command!r} does not parse (exit {exit.code})")


def _run(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, **kwargs)


@pytest.mark.parametrize(
    "argv, codes",
    [
        (["status"], {0, 1}),
        (["status", "--json"], {0, 1}),
        (["shim", "path"], {0}),
        (["check"], {0, 1}),
        (["apply", "--dry-run"], {0}),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_readme_cli_commands_run(argv, codes):
    result = _run(sys.executable, "-m", "airflow_dataset_race_fix", *argv)
    assert result.returncode in codes, result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_reproduce_run_script_starts():
    env = dict(os.environ, ADRF_VENV=sys.prefix)  # reuse this virtualenv instead of creating .venv
    result = _run(str(REPO / "reproduce" / "run"), "--help", env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--backend" in result.stdout


def test_bench_script_starts():
    result = _run(sys.executable, str(REPO / "reproduce" / "bench.py"), "--help")
    assert result.returncode == 0, result.stderr[-2000:]


# Words of the README's "why" column and the reproduction's counter each names.
STOCK_COUNTERS = {
    "empty run": "empty_runs",
    "lost": "lost",
    "doubled": "doubled",
    "out of order": "out_of_order",
}


def test_behaviour_that_differs_names_what_each_scenario_shows_on_stock():
    """A scenario the "Behaviour that differs" table (docs/behaviour.md) cites for a stock outcome shows that
    outcome in the reproduction (its catalog's expectation, which ``reproduce`` and the scenario tests
    hold stock to): issue 31 found S4 cited for empty runs where stock loses the event."""
    from reproduce.harness.catalog import CATALOG

    expected = {info.id: set(info.expect_stock) for info in CATALOG}
    section = (
        BEHAVIOUR.read_text()
        .split("## Behaviour that differs from stock Airflow\n", 1)[1]
        .split("\n## ", 1)[0]
    )
    table = section.split("**Upgrade", 1)[0]
    cited = 0
    for row in (
        line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| what")
    ):
        why = row.split(" | ")[1]
        scenarios = re.findall(r"\bS\d+b?\b", why)
        counters = {counter for word, counter in STOCK_COUNTERS.items() if word in why}
        for scenario in scenarios:
            cited += bool(counters)
            assert counters <= expected[scenario], (
                f"README says stock shows {sorted(counters)} in {scenario}; the reproduction shows "
                f"{sorted(expected[scenario])}: {why!r}"
            )
    assert cited >= 2


def test_what_installing_alone_changes_is_what_airflow_loads():
    """The README's sentence on installing the package alone names every plugin of ours that
    Airflow loads without the opt-in (a real plugin manager in a child interpreter)."""
    code = (
        "import json\n"
        "from airflow import plugins_manager\n"
        "plugins_manager.ensure_plugins_loaded()\n"
        "print('PLUGINS ' + json.dumps([p.name for p in plugins_manager.plugins"
        " if type(p).__module__.startswith('airflow_dataset_race_fix')]))\n"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "AIRFLOW__DATASET_RACE_FIX__ENABLE_VIA_PLUGIN")
    }
    child = _run(sys.executable, "-c", code, env=env)
    assert child.returncode == 0, child.stderr[-3000:]
    loaded = json.loads(next(line for line in child.stdout.splitlines() if line.startswith("PLUGINS "))[8:])
    assert loaded, "installed, the package gives Airflow its web page's plugin"
    section = README.read_text().split("## Turn it on in every Airflow process\n", 1)[1]
    intro = " ".join(section.strip().split("\n\n", 1)[0].split())
    assert "Installing the package" in intro and "changes nothing" not in intro, intro
    for name in loaded:
        assert f"`{name}`" in intro, (
            f"installing adds plugin {name}: the README's sentence must say so: {intro}"
        )
    assert "Browse > Dataset runs" in intro
    assert "Same section." not in README.read_text(), "a sentence that names no section"
