"""
``reproduce``: show every race on stock Airflow and show it gone with the fix.

- deterministic (default): the scenarios S1-S7 of ``harness.scenarios``;
- ``--stress``: ``harness.stress`` (random, seeded);
- ``--e2e``: a real ``airflow scheduler`` running the DAG files of ``reproduce/dags``
  (``e2e``); with ``--executor celery`` several schedulers and Celery workers on Redis,
  optionally with faults injected (``e2e_celery``).

``runner`` is the parent (no Airflow import); each variant runs in ``child`` in a fresh
interpreter on its own scratch database; ``report`` renders the tables.
"""
