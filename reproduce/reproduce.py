#!/usr/bin/env python
"""Same as ``airflow-dataset-race-fix reproduce``: ``python reproduce/reproduce.py [--backend ...] [--stress | --e2e]``."""

from __future__ import annotations

import sys

from airflow_dataset_race_fix.cli import main

if __name__ == "__main__":
    sys.exit(main(["reproduce", *sys.argv[1:]]))
