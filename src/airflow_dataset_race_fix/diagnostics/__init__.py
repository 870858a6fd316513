"""
What ``audit``, ``explain`` and the web page read, shared by the CLI (``commands/``) and the
page (``web/``), which import this layer and never each other: the metadata database opened
as the audit opens it (``database``), the audit's counts (``invariant``), and the fixed
scheduler's verdict for a DAG (``explain``). Read-only except ``requeue``'s writes, which stay
with the CLI.
"""

from __future__ import annotations


def fix_active_here() -> bool:
    """Whether the scheduler module runs the fixed members in this process (shim or source patches)."""
    import importlib

    from airflow_dataset_race_fix import runtime
    from airflow_dataset_race_fix.requeue import SCHEDULER_MODULE

    importlib.import_module(SCHEDULER_MODULE)
    return runtime.module_state(SCHEDULER_MODULE).state in (runtime.PATCHED, runtime.SOURCE_PATCHED)
