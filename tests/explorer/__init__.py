"""
Issue 33's explorer: every interleaving (one per trace) of bounded scenarios of producers
and schedulers, each run on stock Airflow and with the fix on a real database, and an
oracle that reports where the fix does worse than stock. See docs/explorer.md.

Import it only once Airflow is configured (tests/conftest.py, or ``python -m tests.explorer``).
"""
