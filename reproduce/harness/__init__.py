"""
The test bench: scratch databases, a small world of producers and scheduler loops on a
real database, the race scenarios S1-S7 and the stress run.

Written once and used by ``tests/`` and ``reproduce/``. ``database`` imports nothing from
Airflow (it runs before Airflow reads its configuration); the other modules do.
"""
