"""
How the Airflow processes of an e2e run (the scheduler and its task processes) get the fix.

Every Airflow process of the fixed run needs the fix in place before it runs any dataset
code, so it goes through the package's start-up shim: ``airflow_dataset_race_fix.BOOTSTRAP_DIR``
first on PYTHONPATH (its sitecustomize registers post-import hooks; nothing imports
Airflow at start-up), strict, so that a fixed run whose fix cannot apply fails instead of
running unfixed. Stock processes get the shim's off switch, so that neither an inherited
PYTHONPATH nor a ``.pth`` install puts the fix into them.
"""

from __future__ import annotations

import os

import airflow_dataset_race_fix

# Read by the shim (airflow_dataset_race_fix.bootstrap).
ENV_DISABLED = "AIRFLOW_DATASET_RACE_FIX_DISABLED"
ENV_STRICT = "AIRFLOW_DATASET_RACE_FIX_STRICT"


def child_env(env: dict[str, str], variant: str) -> dict[str, str]:
    """``env`` for an Airflow child process of ``variant`` ("stock" or "fixed")."""
    env = dict(env)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and not _is_shim(p)]
    env.pop(ENV_STRICT, None)
    env[ENV_DISABLED] = "1"
    if variant == "fixed":
        paths.insert(0, airflow_dataset_race_fix.BOOTSTRAP_DIR)
        del env[ENV_DISABLED]
        env[ENV_STRICT] = "1"
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    else:
        env.pop("PYTHONPATH", None)
    return env


def _is_shim(path: str) -> bool:
    return os.path.realpath(path) == os.path.realpath(airflow_dataset_race_fix.BOOTSTRAP_DIR)
