"""
Every command behaves as a Unix tool in a pipe whose reader has gone (``audit | head -1``,
``audit | grep -q ...``): no traceback, and exit status 141 (128 + SIGPIPE, as a shell
reports for a tool killed by SIGPIPE), never a status that a command uses for a verdict
(``audit``: 1 findings, 2 bad input; ``status``: 1 not active).

Each case runs the real command in a child whose stdout (or stderr) is a real pipe with no
reader left: the parent closes the read end before the child writes, so the first write
fails with EPIPE, whatever the output's size. The child inherits this session's Airflow
configuration (conftest: AIRFLOW_HOME and the scratch database, migrated).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from matrix import ON_SQLITE_ONLY

from airflow_dataset_race_fix.cli import EXIT_BROKEN_PIPE

pytestmark = ON_SQLITE_ONLY


def run_into_closed_pipe(*argv: str, stream: str = "stdout") -> tuple[int, str]:
    """Run the CLI with ``stream`` a pipe whose read end is already closed: (exit status, the
    other stream's text)."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # no reader from the start: the child's first write gets EPIPE
    other = subprocess.PIPE
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "airflow_dataset_race_fix", *argv],
            stdout=write_end if stream == "stdout" else other,
            stderr=write_end if stream == "stderr" else other,
            stdin=subprocess.DEVNULL,
            text=True,
        )
    finally:
        os.close(write_end)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, (err if stream == "stdout" else out) or ""


@pytest.mark.parametrize(
    "argv",
    [
        ["audit"],
        ["audit", "--json"],
        ["status"],
        ["status", "--json"],
        ["status", "--no-import"],
        ["shim", "path"],
        ["--version"],
        ["--help"],
    ],
    ids=" ".join,
)
def test_a_reader_that_went_away_gives_141_and_no_traceback(argv):
    status, stderr = run_into_closed_pipe(*argv)
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr[-3000:]
    assert "Exception ignored" not in stderr, stderr[-3000:]
    assert status == EXIT_BROKEN_PIPE == 141, (status, stderr[-3000:])


def test_explain_into_a_closed_pipe_gives_141(tmp_path):
    """``explain | head -5``: a DAG that exists, so that explain has something to print."""
    code = (
        "from datetime import datetime, timezone\n"
        "from airflow.datasets import Dataset\n"
        "from airflow.models.dag import DAG\n"
        "from airflow.models.serialized_dag import SerializedDagModel\n"
        "from airflow.operators.empty import EmptyOperator\n"
        "from airflow.utils.session import create_session\n"
        "dag = DAG('adrf_pipe_consumer', schedule=[Dataset('adrf://pipe/a')],"
        " start_date=datetime(2026, 1, 1, tzinfo=timezone.utc))\n"
        "EmptyOperator(task_id='t', dag=dag)\n"
        "with create_session() as session:\n"
        "    DAG.bulk_write_to_db([dag], session=session)\n"
        "    SerializedDagModel.write_dag(dag, session=session)\n"
    )
    dag_file = tmp_path / "adrf_pipe_dag.py"  # Airflow stores the DAG file's code too
    dag_file.write_text(code)
    written = subprocess.run([sys.executable, str(dag_file)], capture_output=True, text=True, timeout=300)
    assert written.returncode == 0, written.stderr[-3000:]
    explained = subprocess.run(
        [sys.executable, "-m", "airflow_dataset_race_fix", "explain", "adrf_pipe_consumer"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert explained.returncode == 0 and "adrf_pipe_consumer" in explained.stdout, explained.stderr[-3000:]
    status, stderr = run_into_closed_pipe("explain", "adrf_pipe_consumer")
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr[-3000:]
    assert status == EXIT_BROKEN_PIPE, (status, stderr[-3000:])


def test_a_closed_stderr_gives_141_too():
    # 'explain NO_SUCH_DAG 2>&1 | true': the one-line error goes to a pipe without a reader.
    status, stdout = run_into_closed_pipe("explain", "no_such_dag_anywhere", stream="stderr")
    assert status == EXIT_BROKEN_PIPE, (status, stdout[-3000:])


def test_a_reader_that_reads_everything_sees_the_commands_own_status():
    # The pipe alone changes nothing: 'audit | cat' is audit's own verdict, whatever the shared
    # test database holds by now (other tests' worlds may leave findings: exit 1 both ways).
    def audit(into: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            f"set -o pipefail; {sys.executable} -m airflow_dataset_race_fix audit {into}",
            shell=True,
            executable="/bin/bash",
            capture_output=True,
            text=True,
            timeout=300,
        )

    alone, piped = audit(">/dev/null"), audit("| cat >/dev/null")
    assert alone.returncode in (0, 1), alone.stderr[-3000:]
    assert piped.returncode == alone.returncode, piped.stderr[-3000:]
