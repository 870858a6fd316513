"""
The fix itself: mirror classes holding the fixed members of Airflow's classes.

One source of truth for both delivery routes: ``runtime`` installs these members on
Airflow's classes at import time, and the source patches in ``patches/`` are generated
from this text. Nothing here imports the shim, the CLI or the patch tools.
"""
