"""
``reproduce``: show every race on stock Airflow and show it gone with the fix.

- deterministic (default): the scenarios S1-S7 of ``harness.scenarios``;
- ``--stress``: ``harness.stress`` (random, seeded);
- ``--e2e``: a real ``airflow scheduler`` running the DAG files of ``reproduce/dags``
  (``e2e``); with ``--executor celery`` several schedulers and Celery workers on Redis,
  optionally with faults injected (``e2e_celery``).

``runner`` is the parent (no Airflow import); each variant runs in ``child`` in a fresh
interpreter on its own scratch database; ``report`` renders the tables. ``benchmark`` measures
what the fix costs (``python reproduce/bench.py``).

The lab lives in the repository, not in the wheel: ``import reproduce`` works from a clone
(the tests put its root on sys.path; ``reproduce/run`` runs ``python -m reproduce``). It uses
the package; the package never imports it.
"""

from __future__ import annotations

import os
import sys

# The clone: what a child interpreter needs on sys.path to import this package.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lab_command(module: str) -> list[str]:
    """The command line that runs the lab's ``module`` as ``python -m`` would, in a fresh
    interpreter, from any working directory: with the clone first on sys.path instead of the
    working directory (in ``reproduce/`` itself, ``reproduce.py`` would stand for this package)."""
    code = (
        f"import runpy, sys; sys.path[0] = {ROOT!r}; "
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    )
    return [sys.executable, "-c", code]
