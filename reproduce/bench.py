#!/usr/bin/env python
"""What the fix costs, stock and fixed side by side: ``python reproduce/bench.py --backend postgres``."""

import sys

from airflow_dataset_race_fix.reproduce.bench import main

if __name__ == "__main__":
    sys.exit(main())
