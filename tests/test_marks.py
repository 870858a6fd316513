"""
How the marks are written (evidence.py), in this interpreter, on the session's database: the verdict a
mark carries is known without hashing source where the fix is off, and from what activation judged where
it is on; a producer's mark is one per host, verdict and hour, and never fails its task. In real
processes (with the fix, without the package, with it off; a LocalExecutor scheduler): test_deployment.py.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from matrix import ON_MAIN_RELEASE_ONLY

pytestmark = ON_MAIN_RELEASE_ONLY


def _never(*args, **kwargs):
    raise AssertionError("the verdict hashed source")


@pytest.fixture
def no_hashing(monkeypatch):
    """Any source hashing fails the test; the verdict is judged afresh."""
    import airflow.datasets.manager  # noqa: F401  the targets a task process has imported
    import airflow.jobs.scheduler_job_runner  # noqa: F401

    from airflow_dataset_race_fix import runtime, verdict
    from airflow_dataset_race_fix.source_patches import members

    monkeypatch.setattr(runtime, "fingerprint", _never)
    monkeypatch.setattr(members, "dedented_sha256", _never)
    monkeypatch.setattr(verdict, "_verdict", None)
    return verdict


def test_the_verdict_where_the_fix_is_off_hashes_nothing(variant_stock, no_hashing, monkeypatch):
    from airflow_dataset_race_fix import bootstrap

    monkeypatch.setattr(bootstrap, "started", False)
    monkeypatch.delenv(bootstrap.ENV_DISABLED, raising=False)
    not_activated = "no route turned the shim on in this process (docs/activation.md)"
    assert no_hashing.process_verdict() == (False, not_activated)
    monkeypatch.setenv(bootstrap.ENV_DISABLED, "1")
    monkeypatch.setattr(no_hashing, "_verdict", None)
    assert no_hashing.process_verdict() == (False, "disabled by AIRFLOW_DATASET_RACE_FIX_DISABLED")


def test_the_verdict_where_the_fix_is_on_reuses_activation(variant_fixed, no_hashing, monkeypatch):
    from airflow_dataset_race_fix import bootstrap

    monkeypatch.setattr(bootstrap, "started", True)
    assert no_hashing.process_verdict() == (True, "patched by the shim")


def test_a_forked_child_keeps_its_parents_verdict(variant_stock, no_hashing, monkeypatch):
    from airflow_dataset_race_fix import bootstrap

    monkeypatch.setattr(bootstrap, "started", False)
    parent = no_hashing.process_verdict()
    judged = []
    monkeypatch.setattr(no_hashing, "_process_verdict", lambda: judged.append(1) or (True, "judged again"))
    pid = os.fork()
    if pid == 0:  # the child: its answer is its exit status
        os._exit(0 if no_hashing.process_verdict() == parent and not judged else 1)
    assert os.waitpid(pid, 0)[1] == 0


def _task(outlets=("a dataset",), run_id="r1"):
    return SimpleNamespace(
        task=SimpleNamespace(outlets=list(outlets), owner="airflow"),
        dag_id="adrf_marks",
        task_id="emit",
        run_id=run_id,
        map_index=-1,
        try_number=1,
        execution_date=None,
    )


def _producer_marks() -> list[dict]:
    from airflow.models.log import Log
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from airflow_dataset_race_fix.evidence import MARK_EVENT

    with create_session() as session:
        rows = session.execute(
            select(Log.run_id, Log.extra).where(Log.event == MARK_EVENT, Log.dag_id == "adrf_marks")
        ).all()
    return [{**json.loads(extra), "run_id": run_id} for run_id, extra in rows]


@pytest.fixture
def fresh_host(monkeypatch, tmp_path):
    """This process as a host of its own: its claim files in a directory of the test's, no marks yet."""
    import tempfile

    from airflow.models.log import Log
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    from airflow_dataset_race_fix import evidence

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    with create_session() as session:
        session.execute(delete(Log).where(Log.dag_id == "adrf_marks"))
    return evidence


def test_one_producer_mark_a_host_verdict_and_hour(fresh_host, monkeypatch):
    import time

    hour = 3600 * 500_000
    monkeypatch.setattr(time, "time", lambda: hour + 10.0)
    for run in ("r1", "r2", "r3"):  # three tasks of the same hour (each would be a process of its own)
        fresh_host.mark_producer(_task(run_id=run))
    fresh_host.mark_producer(_task(outlets=(), run_id="r4"))  # no outlets: never a producer's mark
    assert [m["run_id"] for m in _producer_marks()] == ["r1"]
    monkeypatch.setattr(time, "time", lambda: hour + 3600 + 10.0)  # the next hour: the next task writes it
    fresh_host.mark_producer(_task(run_id="r5"))
    marks = _producer_marks()
    assert sorted(m["run_id"] for m in marks) == ["r1", "r5"] and {m["component"] for m in marks} == {"task"}


def test_a_mark_that_cannot_be_written_fails_no_task_and_is_tried_again(fresh_host, monkeypatch, caplog):
    def broken(extra, task_instance=None):
        raise RuntimeError("the audit log is gone")

    written = fresh_host._write
    monkeypatch.setattr(fresh_host, "_write", broken)
    fresh_host.mark_producer(_task(run_id="r1"))  # raises nothing
    assert "could not record this producer's mark: the audit log is gone" in caplog.text
    monkeypatch.setattr(fresh_host, "_write", written)
    fresh_host.mark_producer(_task(run_id="r2"))  # the hour was not claimed: the next task writes it
    assert [m["run_id"] for m in _producer_marks()] == ["r2"]
    fresh_host.mark_producer(SimpleNamespace())  # not even a task instance: nothing, and no exception


def test_the_documented_delete_removes_the_marks_and_nothing_else(fresh_host):
    """docs/activation.md's statement, as an operator pastes it, on this backend."""
    from airflow.models.log import Log
    from airflow.utils.session import create_session
    from sqlalchemy import func, select, text

    doc = (Path(__file__).parents[1] / "docs" / "activation.md").read_text()
    statement = re.search(r"^(DELETE FROM log WHERE event = 'dataset-race-fix';)$", doc, re.MULTILINE)[1]
    fresh_host.mark_producer(_task())
    with create_session() as session:
        session.add(Log("adrf-marks-other", dag_id="adrf_marks"))
    with create_session() as session:
        session.execute(text(statement.rstrip(";")))
    with create_session() as session:
        left = session.execute(
            select(Log.event, func.count()).where(Log.dag_id == "adrf_marks").group_by(Log.event)
        ).all()
    assert left == [("adrf-marks-other", 1)]
