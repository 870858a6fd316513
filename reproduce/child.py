"""
One variant (stock or fixed) of one reproduction mode, in its own interpreter.

Run by the parent as ``python -m reproduce.child SPEC_JSON``.
It points Airflow at the scratch database the parent made, creates the schema, puts
the fix in place for the fixed variant, runs the mode and prints one JSON object on
stdout. Airflow logs to stdout, so stdout is moved to stderr first and the JSON is
written to the original stdout; progress lines go to stderr, which the parent shows.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

PROGRESS_PREFIX = ""


def progress(message: str) -> None:
    print(f"{PROGRESS_PREFIX}{message}", file=sys.stderr, flush=True)


def _prepare(spec: dict[str, Any]) -> dict[str, Any]:
    """Airflow configured on the scratch database, schema created, fix applied if asked."""
    from reproduce.harness.database import configure_airflow_env, init_airflow_db

    configure_airflow_env(spec["db_url"], spec["airflow_home"])
    os.environ.update(spec.get("airflow_env", {}))
    import airflow_dataset_race_fix

    _quietly(init_airflow_db)
    states = []
    if spec["variant"] == "fixed":
        states = [s.state for s in airflow_dataset_race_fix.apply(strict=True)]
    from airflow import __version__

    return {"airflow_version": __version__, "fix_states": states}


@contextlib.contextmanager
def ticker(what: str, every: float = 10.0):
    """Print ``what`` with the elapsed time every ``every`` seconds while the block runs."""
    stop, started = threading.Event(), time.monotonic()

    def tick() -> None:
        while not stop.wait(every):
            progress(f"{what}: {time.monotonic() - started:.0f} s")

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _quietly(fn) -> None:
    """Run ``fn`` with stdout/stderr captured (alembic's INFO lines); show them only if it fails."""
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            fn()
        except BaseException:
            os.dup2(saved, 2)
            capture.seek(0)
            sys.stderr.write(capture.read())
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def run_deterministic(spec: dict[str, Any]) -> dict[str, Any]:
    from reproduce.harness.scenarios import SCENARIOS, run_scenario

    only = set(spec.get("only") or ())
    results = []
    for scenario in SCENARIOS:
        if only and scenario.id not in only:
            continue
        entry: dict[str, Any] = {
            "id": scenario.id,
            "title": scenario.title,
            "expect_stock": list(scenario.expect_stock),
        }
        if not scenario.applies_to(spec["backend"]):
            entry["skipped"] = f"cannot happen on {spec['backend']}"
            results.append(entry)
            continue
        started = time.monotonic()
        try:
            outcome = run_scenario(scenario)
            entry.update(
                totals=outcome.report.totals(), violations=outcome.violations, shows_bug=outcome.shows_bug()
            )
        except Exception as err:  # a broken interleaving is a finding for this scenario only
            entry["error"] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        entry["seconds"] = round(time.monotonic() - started, 1)
        progress(f"{scenario.id:<4} {scenario.title:<40} {_short(entry)} ({entry['seconds']}s)")
        results.append(entry)
    return {"scenarios": results}


def run_stress(spec: dict[str, Any]) -> dict[str, Any]:
    from reproduce.harness.stress import StressConfig
    from reproduce.harness.stress import run_stress as stress

    config = StressConfig(
        seed=spec["seed"],
        producers=spec["producers"],
        events_per_producer=spec["events"],
        schedulers=spec.get("schedulers"),
    )
    # The harness logs the whole result as a dict; the parent tabulates it instead.
    with ticker("stress running"):
        result = stress(config, log=lambda line: None if line.startswith("stress result") else progress(line))
    return {"stress": result.as_dict(), "problems": result.problems()}


def run_e2e(spec: dict[str, Any]) -> dict[str, Any]:
    if spec.get("executor") == "celery":
        from reproduce import e2e_celery as driver
    else:
        from reproduce import e2e as driver

    return {"e2e": driver.run(spec, progress=progress)}


MODES = {"deterministic": run_deterministic, "stress": run_stress, "e2e": run_e2e}


def _short(entry: dict[str, Any]) -> str:
    if "error" in entry:
        return f"error: {entry['error']}"
    return ", ".join(f"{k}={v}" for k, v in entry["violations"].items()) or "no violation"


def _error_message(err: BaseException) -> str:
    from airflow_dataset_race_fix.runtime import RefusedError

    if isinstance(err, RefusedError):
        return f"the fix refused to apply: {err}"
    orig = getattr(err, "orig", None)  # SQLAlchemy wraps the driver's error
    text = str(orig if orig is not None else err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"


def _terminate(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    global PROGRESS_PREFIX
    spec = json.loads((argv or sys.argv[1:])[0])
    signal.signal(signal.SIGTERM, _terminate)  # the parent stops us: run the finally blocks
    PROGRESS_PREFIX = spec.get("progress_prefix", "")
    result_stream = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # Airflow's console logging writes to stdout; keep stdout for the JSON
    sys.stdout = sys.stderr
    result: dict[str, Any] = {"variant": spec["variant"], "backend": spec["backend"], "mode": spec["mode"]}
    started = time.monotonic()
    try:
        result.update(_prepare(spec))
        result.update(MODES[spec["mode"]](spec))
    except Exception as err:
        result["error"] = _error_message(err)
        result["traceback"] = traceback.format_exc()
        progress(f"error: {result['error']}\n{result['traceback']}")
    finally:
        _dispose()
    result["seconds"] = round(time.monotonic() - started, 1)
    result_stream.write(json.dumps(result, default=str))
    result_stream.flush()
    return 0


def _dispose() -> None:
    """Close pooled connections so that the parent can drop the database."""
    if "airflow.settings" in sys.modules:
        try:
            sys.modules["airflow.settings"].dispose_orm()
        except Exception:
            pass


if __name__ == "__main__":
    sys.exit(main())
