"""
Whether this process runs the fix, and if not, why: the start-up (``bootstrap``: did a route
start the shim) and the patching (``runtime``: what each target became) read together. The
plugin's listener logs it once per process, each mark records it (``evidence``), ``status``
says it. Reads nothing but this interpreter.
"""

from __future__ import annotations

import logging
import os
import sys

from airflow_dataset_race_fix import bootstrap, runtime
from airflow_dataset_race_fix.targets import MEMBERS, TARGET_MODULES

_said_not_started = False  # announce_process()'s line for a process without the shim
_verdict: tuple | None = None  # process_verdict()'s last answer, with what it depends on


def _forget_reports() -> None:
    """A forked child (LocalExecutor's task, a task runner's raw task) logs to its own task log:
    it says it again."""
    global _said_not_started
    _said_not_started = False


os.register_at_fork(after_in_child=_forget_reports)


def why_not_started() -> tuple[int, str] | None:
    """Why the shim did not start in this process, and how loudly to say it; None when it started."""
    from airflow_dataset_race_fix import activation

    if bootstrap.started:
        return None
    if bootstrap.env_flag(bootstrap.ENV_DISABLED):
        return runtime.announce_level(), f"disabled by {bootstrap.ENV_DISABLED}"
    if activation.pythonpath_entries() and not (sys.flags.no_site or sys.flags.ignore_environment):
        hiding = getattr(sys.modules.get("sitecustomize"), "__file__", None) or "no sitecustomize"
        return logging.WARNING, (
            f"displaced: its directory is on PYTHONPATH, but {hiding} ran instead of its sitecustomize "
            "(a tool put its own first and does not chain to ours, as opentelemetry-instrument does); "
            "the .pth route survives that: 'airflow-dataset-race-fix shim install-pth' (docs/activation.md)"
        )
    return runtime.announce_level(), "no route turned the shim on in this process (docs/activation.md)"


def announce_process() -> None:
    """Say once per process that imported a target (a forked task is a process of its own, with its
    own log) whether its code is fixed, and if not, why. Called by the plugin's listener as each
    Airflow component or task starts."""
    global _said_not_started
    imported = [name for name in TARGET_MODULES if name in sys.modules]
    why = why_not_started() if imported else None
    if why is not None and not _said_not_started:
        _said_not_started = True
        if process_verdict()[0]:
            why = None  # fixed without the shim: the source patches
        else:
            message = "airflow-dataset-race-fix: the fix is NOT in place in this process: %s (Airflow %s)"
            runtime.log.log(why[0], message, why[1], runtime.airflow_version())
    if why is None:
        runtime.announce_imported()


def process_verdict() -> tuple[bool, str]:
    """Whether the targets this process imported run the fixed code, and how, or why not (its marks
    say it). Remembered until a target is imported, patched or refused (a forked child keeps its
    parent's answer)."""
    global _verdict
    key = (bootstrap.started, runtime.decisions())
    if _verdict is None or _verdict[0] != key:
        _verdict = key, _process_verdict()
    return _verdict[1]


def _process_verdict() -> tuple[bool, str]:
    why = why_not_started()
    added = [m for m in MEMBERS if m.original_sha256 is None and m.module in sys.modules]
    has_added = all(m.name in vars(getattr(sys.modules[m.module], m.owner, object)) for m in added)
    if why is not None and not has_added:  # only the source patches give unpatched code the fix's members
        return False, why[1]  # stock code without the shim: known without hashing a line of it
    states = [runtime.module_state(name) for name in TARGET_MODULES if name in sys.modules]
    refused = next((s for s in states if s.state == runtime.REFUSED), None)
    if refused is not None:
        return False, f"refused: {refused.module}: {refused.detail}"
    fixed = all(s.state in (runtime.PATCHED, runtime.SOURCE_PATCHED) for s in states)
    if fixed and (states or why is None):
        # none imported yet: the shim waits for them
        shim = any(s.state == runtime.PATCHED for s in states) or not states
        return True, "patched by the shim" if shim else "the source patches"
    return False, why[1] if why else "not patched"
