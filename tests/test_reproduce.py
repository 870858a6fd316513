"""
``reproduce``: the command a newcomer runs first. Each test runs it as a user would, in
a subprocess: the parent starts a stock and a fixed child interpreter, each on its own
scratch database on the backend named by ADRF_BACKEND (server URLs from ADRF_*_URL).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import AIRFLOW_VERSION, BACKEND

ROOT = Path(__file__).resolve().parent.parent


def reproduce(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reproduce", *args],  # from the clone's root, as reproduce/run runs it
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def test_deterministic_shows_every_race_on_stock_and_none_fixed(tmp_path):
    out = tmp_path / "result.json"
    done = reproduce("--backend", BACKEND, "--json", str(out))
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    result = json.loads(out.read_text())
    assert result["ok"] and result["backend"] == BACKEND
    stock, fixed = (next(r for r in result["runs"] if r["variant"] == v) for v in ("stock", "fixed"))
    assert fixed["fix_states"] and set(fixed["fix_states"]) == {"patched"}
    assert stock["fix_states"] == []
    ran = [s for s in stock["scenarios"] if "skipped" not in s]
    assert {"S1", "S2", "S4", "S6"} <= {s["id"] for s in ran}
    for scenario in ran:
        assert scenario["shows_bug"], scenario
    for scenario in fixed["scenarios"]:
        assert "skipped" in scenario or scenario["violations"] == {}, scenario
    assert "S1  stale queue timestamp" in done.stdout  # the table
    assert "bug shown" in done.stdout and "forced interleavings" in done.stdout and "--e2e" in done.stdout
    if BACKEND == "sqlite":
        assert (
            "not run on sqlite: S2b (--backend postgres or mysql), S3 (--backend postgres or mysql)"
            in done.stdout
        )


@pytest.mark.parametrize("only", ["S9", "inapplicable"])
def test_only_a_scenario_that_cannot_run_is_a_usage_error_before_any_child(only):
    from reproduce.harness import catalog

    if only == "inapplicable":
        elsewhere = catalog.elsewhere(BACKEND)
        if not elsewhere:
            pytest.skip(f"every scenario can happen on {BACKEND}")
        only = elsewhere[0].id
    done = reproduce("--backend", BACKEND, "--only", only, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and done.stdout == "", done.stderr
    assert f"--only {only}: " in lines[0]
    assert f"On {BACKEND}: " in lines[0] or f"(on {BACKEND}: " in lines[0]
    assert ", ".join(catalog.applicable_ids(BACKEND)) in lines[0]


def test_missing_requirements_name_the_one_command_that_installs_them(monkeypatch, capsys):
    """A run on postgres with Celery where nothing extra is installed: the parent refuses with
    one pip command (the installed Airflow's pins, by absolute path), and reproduce/run's helper
    prints the same requirements to install."""
    from reproduce import requirements, runner

    monkeypatch.setattr(requirements, "_installed", lambda module: False)
    monkeypatch.setattr(requirements, "_distribution_installed", lambda name: False)
    with pytest.raises(runner.ReproduceError) as refused:
        runner.check_requirements("postgres", "celery")
    message = str(refused.value)
    constraints = ROOT / "requirements" / f"constraints-airflow-{AIRFLOW_VERSION}-py3.11.txt"
    celery = ROOT / "requirements" / "celery-e2e-airflow-2.10.4-py3.11.txt"
    assert f"-m pip install -c {constraints} time-machine psycopg2-binary -r {celery}" in message
    assert requirements.main(["--backend", "mysql", "--e2e", "--executor", "celery"]) == 0
    assert capsys.readouterr().out.split() == ["time-machine", "mysqlclient", "-r", str(celery)]
    monkeypatch.setattr(requirements, "_installed", lambda module: True)
    monkeypatch.setattr(requirements, "_distribution_installed", lambda name: True)
    assert requirements.main(["--backend", "postgres"]) == 0 and capsys.readouterr().out == ""


def test_script_is_the_same_command():
    done = subprocess.run(
        [sys.executable, str(ROOT / "reproduce" / "reproduce.py"), "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0 and "--e2e" in done.stdout and "--stress" in done.stdout


def test_unreachable_server_is_one_clear_line():
    pytest.importorskip("psycopg2", reason="the postgres driver is installed in the postgres envs only")
    done = reproduce("--db-url", "postgresql+psycopg2://postgres@127.0.0.1:1/test", timeout=120)
    assert done.returncode == 2
    assert "reproduce: error: postgres server at" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.skipif(BACKEND == "sqlite", reason="a server's database")
def test_a_named_database_is_ours_and_an_existing_one_is_refused_untouched():
    """Issue 50: --database NAME for a server with naming rules; a database that exists is not ours."""
    import secrets

    from sqlalchemy import create_engine, text

    from reproduce.harness.database import ScratchDatabase

    name = f"adrf_named_{secrets.token_hex(3)}"
    existing = ScratchDatabase(BACKEND, name=name)
    engine = create_engine(existing.create())
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE theirs (id INTEGER)"))
        done = reproduce("--backend", BACKEND, "--database", name, "--only", "S1", timeout=120)
        assert done.returncode == 2 and f"database {name!r} already exists" in done.stderr, done.stderr[
            -2000:
        ]
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM theirs")).scalar() == 0  # neither used nor dropped
    finally:
        engine.dispose()
        existing.drop()
    done = reproduce("--backend", BACKEND, "--database", name, "--only", "S1")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stderr.count(f"on database {name}\n") == 2  # stock, then fixed, each on its own
    assert not existing.exists()  # dropped after each


@pytest.mark.parametrize(
    "backend, name, expected",
    [("sqlite", "adrf_x", "SQLite runs on a temporary file"), ("postgres", "x; DROP", "letters, digits")],
)
def test_a_bad_database_name_is_a_usage_error(backend, name, expected):
    done = reproduce("--backend", backend, "--database", name, timeout=120)
    assert done.returncode == 2 and expected in done.stderr and "Traceback" not in done.stderr, done.stderr[
        -2000:
    ]


def test_conflicting_backend_and_url():
    done = reproduce("--backend", "mysql", "--db-url", "postgresql://postgres@127.0.0.1/test", timeout=120)
    assert done.returncode == 2 and "does not match" in done.stderr


def test_unsupported_airflow_is_refused_before_anything_runs(monkeypatch):
    import importlib.metadata

    from reproduce import runner

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.9.3")
    with pytest.raises(runner.ReproduceError, match="Airflow 2.9.3 is not supported"):
        runner.check_airflow_version()


@pytest.mark.skipif(
    os.environ.get("ADRF_E2E") != "1", reason="e2e with a real scheduler is opt-in (ADRF_E2E=1)"
)
def test_e2e_real_scheduler(tmp_path):
    """One stock and one fixed run of a real scheduler: the fix must lose nothing and fail no producer."""
    out = tmp_path / "e2e.json"
    done = reproduce("--e2e", "--backend", BACKEND, "--json", str(out), timeout=1800)
    print(done.stdout)
    result = json.loads(out.read_text())
    fixed = [r for r in result["runs"] if r["variant"] == "fixed"]
    assert fixed and all(not r.get("error") and r["e2e"]["problems"] == {} for r in fixed), done.stdout
    stock = [r for r in result["runs"] if r["variant"] == "stock"]
    print("stock problems:", [r.get("error") or r["e2e"]["problems"] for r in stock])


def test_celery_refuses_sqlite_clearly():
    done = reproduce("--e2e", "--executor", "celery", "--backend", "sqlite", timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Airflow refuses CeleryExecutor on SQLite" in done.stderr
    assert "Traceback" not in done.stderr


def test_chaos_needs_celery():
    done = reproduce("--e2e", "--backend", "sqlite", "--chaos", "kill-worker", timeout=120)
    assert done.returncode == 2 and "--chaos needs --e2e --executor celery" in done.stderr


@pytest.mark.skipif(
    os.environ.get("ADRF_E2E_CELERY") != "1", reason="CeleryExecutor e2e is opt-in (ADRF_E2E_CELERY=1)"
)
@pytest.mark.skipif(BACKEND == "sqlite", reason="Airflow runs no CeleryExecutor on SQLite")
def test_e2e_celery_with_chaos(tmp_path):
    """Stock and fixed on CeleryExecutor while a scheduler and a worker are SIGKILLed and restarted:
    every fault is injected, nothing is lost, doubled, empty, out of order or left queued with the
    fix, and no producer fails or needs a retry for any reason but the faults."""
    out = tmp_path / "e2e-celery.json"
    done = reproduce(
        "--e2e",
        "--executor",
        "celery",
        "--backend",
        BACKEND,
        "--chaos",
        "kill-scheduler",
        "--chaos",
        "kill-worker",
        "--json",
        str(out),
        timeout=2400,
    )
    print(done.stdout)
    result = json.loads(out.read_text())
    for run in result["runs"]:
        assert not run.get("error"), done.stdout + done.stderr[-3000:]
        assert [f["fault"] for f in run["e2e"]["faults"] if f["fault"] != "restart"] == [
            "kill-scheduler",
            "kill-worker",
        ]
        assert run["e2e"]["topology"]["schedulers"] == (2 if BACKEND == "postgres" else 1)
    fixed = [r for r in result["runs"] if r["variant"] == "fixed"]
    assert fixed and all(r["e2e"]["fix_active_count"] == r["e2e"]["producer_tis_succeeded"] for r in fixed)
    assert all(r["e2e"]["violations"] == {} for r in fixed), done.stdout
    assert all(r["e2e"]["problems"] == {} for r in fixed), done.stdout
