"""
``audit`` as a cron job runs it: exit 1 means findings, so every setup error is one line on
stderr and exit 2; the audit creates no file and no directory; Ctrl-C at any moment gives
130 and no report.

Each case runs the real command in a child interpreter, because what is checked happens
before and while Airflow is imported (its configuration, its logging, its database driver).
The child inherits this session's Airflow configuration (conftest: AIRFLOW_HOME and the
scratch database of ADRF_BACKEND).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from matrix import ON_SQLITE_ONLY

pytestmark = ON_SQLITE_ONLY

REPO = Path(__file__).resolve().parents[1]
ONE_LINE_ERROR = "airflow-dataset-race-fix audit: error: "


def run_audit(
    *args: str, env: dict | None = None, python: str = sys.executable, cwd=None, airflow_config: bool = True
) -> subprocess.CompletedProcess:
    """``audit ARGS`` in a child with this environment plus ``env``; without this session's
    ``AIRFLOW__*`` settings unless ``airflow_config``."""
    base = {k: v for k, v in os.environ.items() if airflow_config or not k.startswith("AIRFLOW__")}
    return subprocess.run(
        [python, "-m", "airflow_dataset_race_fix", "audit", *args],
        env={**base, **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_one_line_exit_2(result: subprocess.CompletedProcess, *expected: str) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith(ONE_LINE_ERROR), result.stderr[-3000:]
    assert result.stdout == ""
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def test_without_airflow_installed(tmp_path):
    subprocess.run(
        [sys._base_executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=120
    )
    result = run_audit(
        python=str(tmp_path / "bare" / "bin" / "python"), env={"PYTHONPATH": str(REPO / "src")}
    )
    assert_one_line_exit_2(result, "Apache Airflow is not installed in")


@pytest.mark.parametrize("home", ["/proc/nowhere", "{tmp}/no-such-home"])
def test_an_airflow_home_that_does_not_exist(tmp_path, home):
    home = home.format(tmp=tmp_path)
    result = run_audit(env={"AIRFLOW_HOME": home}, cwd=tmp_path)
    assert_one_line_exit_2(result, f"AIRFLOW_HOME {home} is not a directory", "--db-url")
    assert not os.path.exists(home)


def test_an_unreadable_airflow_cfg(tmp_path):
    (tmp_path / "airflow.cfg").write_text("[database\nsql_alchemy_conn = sqlite:////nowhere.db\n")
    result = run_audit(env={"AIRFLOW_HOME": str(tmp_path)}, airflow_config=False, cwd=tmp_path)
    assert_one_line_exit_2(result, "cannot import Airflow here: File contains no section headers")


@pytest.mark.parametrize(
    "url, expected",
    [
        (
            "postgresql+pg8000://u@127.0.0.1/db",
            "the driver for postgresql+pg8000 is not installed: No module named 'pg8000'",
        ),
        ("oracle://u@127.0.0.1/db", "unsupported backend 'oracle'"),
    ],
    ids=["missing-driver", "oracle"],
)
def test_a_url_from_airflows_configuration(url, expected):
    result = run_audit(env={"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url})
    assert_one_line_exit_2(result, "[database] sql_alchemy_conn: ", expected)


@pytest.mark.parametrize(
    "url, module, package",
    [
        ("postgresql+psycopg2://u@127.0.0.1/db", "psycopg2", "psycopg2-binary"),
        ("mysql://u@127.0.0.1/db", "MySQLdb", "mysqlclient"),
    ],
    ids=["psycopg2", "mysqlclient"],
)
def test_a_missing_driver_names_the_package_to_install(tmp_path, url, module, package):
    """Issue 50: the driver's own package, not an extra of this package (it is on no index)."""
    (tmp_path / f"{module}.py").write_text(f"raise ModuleNotFoundError(\"No module named '{module}'\")\n")
    result = run_audit("--db-url", url, env={"PYTHONPATH": str(tmp_path)})
    line = assert_one_line_exit_2(result, f"No module named '{module}' (pip install {package})")
    assert "airflow-dataset-race-fix[" not in line


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--db-url", "oracle://u@127.0.0.1/db"], "--db-url: unsupported backend 'oracle'"),
        (["--db-url", "mysql://u@127.0.0.1:notaport/db"], "--db-url: not a valid database URL"),
        (["--db-url", "sqlite:///{db}?timeout=abc"], "--db-url: bad database URL argument"),
        (
            ["--db-url", "sqlite:///{tmp}/empty.db"],
            "no SQLite database file at {tmp}/empty.db; check AIRFLOW_HOME",
        ),
        (["--since", "800000d"], "--since '800000d': out of range"),
        (["--since", "9999-12-31T23:59:59-14:00"], "out of range"),
        (["--since", "0001-01-01T00:00:00+01:00"], "out of range"),
    ],
    ids=[
        "oracle",
        "port",
        "sqlite-timeout",
        "no-sqlite-file",
        "since-duration",
        "since-date-late",
        "since-date-early",
    ],
)
def test_bad_argument_values(tmp_path, args, expected):
    db = tmp_path / "x.db"
    db.write_bytes(b"")
    fill = {"db": db, "tmp": tmp_path}
    result = run_audit(*(a.format(**fill) for a in args))
    assert_one_line_exit_2(result, expected.format(**fill))


def _tree(root: Path) -> dict[str, tuple]:
    return {
        str(p.relative_to(root)): (p.is_dir(), p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
    }


def _a_dag_waiting_on_a_queue_row() -> str:
    """A consuming DAG with an event and its queue row (the audit deserializes such a DAG)."""
    from reproduce.harness.world import World

    world = World("audit-cli")
    try:
        dataset = world.dataset("a")
        dag_id = world.consumer("d", [dataset])
        producer = world.producer("P")
        world.clock.at(1), world.emit(producer, dataset), producer.finish()
    finally:
        world.close()  # stops its frozen clock: later tests run on real time
    return dag_id


def test_audit_creates_no_file_and_no_directory(tmp_path, variant_stock):
    """In an empty AIRFLOW_HOME (Airflow's default: SQLite there), against a missing SQLite file,
    and on this session's real database, nothing appears or changes: not the home, not logs/,
    not an airflow.db, not a SQLite journal."""
    dag_id = _a_dag_waiting_on_a_queue_row()
    empty_home = tmp_path / "empty-home"
    empty_home.mkdir()
    work = tmp_path / "cwd"
    work.mkdir()
    session_home = Path(os.environ["AIRFLOW_HOME"])
    before = {root: _tree(root) for root in (tmp_path, session_home)}

    result = run_audit(env={"AIRFLOW_HOME": str(empty_home)}, airflow_config=False, cwd=work)
    assert_one_line_exit_2(result, f"no SQLite database file at {empty_home}/airflow.db")
    result = run_audit("--db-url", f"sqlite:///{tmp_path}/x/empty.db", cwd=work)
    assert_one_line_exit_2(result, "no SQLite database file")
    result = run_audit(cwd=work)  # the session's configuration and database: a real audit
    assert result.returncode in (0, 1) and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert dag_id in result.stdout, result.stdout[-3000:]

    assert {root: _tree(root) for root in (tmp_path, session_home)} == before


def test_missing_tables_say_what_to_check(tmp_path):
    import sqlite3

    db = tmp_path / "other.db"
    sqlite3.connect(db).execute("CREATE TABLE dag_run (id INTEGER PRIMARY KEY)").connection.close()
    result = run_audit("--db-url", f"sqlite:///{db}")
    assert_one_line_exit_2(result, "missing tables", "check AIRFLOW_HOME", "airflow db migrate")


def test_ctrl_c_at_any_moment_gives_130_and_no_report():
    """SIGINT at points spread over a whole audit (interpreter start, Airflow's imports, the
    scan): never a report, never 0, 1 or 2. Before main() runs, Python itself dies of the
    signal (-SIGINT, which a shell shows as 130). Once the report is out, a SIGINT changes
    nothing: the report keeps its exit status."""

    def audit_interrupted_after(seconds: float | None) -> tuple[int, str] | None:
        """(exit status, stdout) of an audit sent SIGINT after ``seconds``; None if it ended before."""
        child = subprocess.Popen(
            [sys.executable, "-m", "airflow_dataset_race_fix", "audit"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal's foreground job
        )
        if seconds is not None:
            time.sleep(seconds)
            report_is_out = select.select([child.stdout], [], [], 0)[0]
            if report_is_out or child.poll() is not None:
                child.communicate()
                return None
            child.send_signal(signal.SIGINT)
        stdout, _ = child.communicate(timeout=300)
        return child.returncode, stdout

    started = time.monotonic()
    code, stdout = audit_interrupted_after(None)
    duration = time.monotonic() - started
    assert code in (0, 1) and stdout, code
    outcomes = {}
    for step in range(10):
        delay = round(0.25 + (duration - 0.25) * step / 10, 2)
        outcomes[delay] = audit_interrupted_after(delay)
    interrupted = {
        delay: (code, len(out))
        for delay, (code, out) in ((d, o) for d, o in outcomes.items() if o is not None)
    }
    assert len(interrupted) >= 5, f"the audit ({duration:.1f} s) printed before most interrupts: {outcomes}"
    assert all(code in (130, -signal.SIGINT) and not out for code, out in interrupted.values()), str(
        interrupted
    )
    assert 130 in [code for code, _ in interrupted.values()], str(interrupted)
