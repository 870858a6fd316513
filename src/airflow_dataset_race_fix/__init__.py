"""
airflow-dataset-race-fix: dataset-triggered scheduling in Airflow 2.10/2.11 that loses no events.

``apply()`` puts the fix in place in the current interpreter and ``unapply()`` takes it
out. Importing this package imports nothing from Airflow.
"""

from __future__ import annotations

import os

__version__ = "0.1.0"

# The directory that, put on PYTHONPATH, turns the fix on in every Python process.
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")


def apply(strict: bool = False):
    """Patch Airflow in this interpreter now (imports the targeted Airflow modules)."""
    from airflow_dataset_race_fix import runtime

    return runtime.apply(strict=strict)


def unapply() -> None:
    """Restore Airflow's original members in this interpreter."""
    from airflow_dataset_race_fix import runtime

    runtime.unapply()
