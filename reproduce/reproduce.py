#!/usr/bin/env python
"""Same as ``airflow-dataset-race-fix reproduce``: ``python reproduce/reproduce.py [--backend ...] [--stress | --e2e]``."""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # a script: the clone on sys.path, not reproduce/ (its reproduce.py is no package)
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import reproduce  # noqa: E402,F401  the lab the command runs: this clone's, whatever install the package comes from
from airflow_dataset_race_fix.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["reproduce", *sys.argv[1:]]))
