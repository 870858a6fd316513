#!/usr/bin/env python
"""Same as ``airflow-dataset-race-fix reproduce``: ``python reproduce/reproduce.py [--backend ...] [--stress | --e2e]``."""

from __future__ import annotations

import argparse
import sys

from airflow_dataset_race_fix.reproduce import runner

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="reproduce.py", description=__doc__)
    runner.add_arguments(parser)
    sys.exit(runner.main(parser.parse_args()))
