import sys

from airflow_dataset_race_fix.cli import main

sys.exit(main())
