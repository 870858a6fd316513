"""
What ``audit``, ``explain`` and the web page read, shared by the CLI (``commands/``) and the
page (``web/``), which import this layer and never each other: the metadata database opened
as the audit opens it (``database``), the audit's counts (``invariant``), and the fixed
scheduler's verdict for a DAG (``explain``). Read-only except ``requeue``'s writes, which stay
with the CLI.
"""

from __future__ import annotations

_JUDGED: dict = {}  # the scheduler module's target members as last judged, and the verdict


def fix_active_here() -> bool:
    """
    Whether the scheduler module runs the fixed members in this process (shim or source patches), judged
    again only once one of those members was replaced: judging reads their source (0.1-0.2 s of each of the
    page's requests).
    """
    import importlib

    from airflow_dataset_race_fix import runtime
    from airflow_dataset_race_fix.targets import SCHEDULER_MODULE, members_of

    module = importlib.import_module(SCHEDULER_MODULE)
    members = [vars(getattr(module, m.owner, object)).get(m.name) for m in members_of(SCHEDULER_MODULE)]
    if _JUDGED.get("members") != members:  # functions compare by identity
        state = runtime.module_state(SCHEDULER_MODULE).state
        _JUDGED.update(members=members, active=state in (runtime.PATCHED, runtime.SOURCE_PATCHED))
    return _JUDGED["active"]
