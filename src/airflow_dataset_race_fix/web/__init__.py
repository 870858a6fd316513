"""
A page in Airflow's web UI: why each dataset-triggered DAG runs next or waits (``explain``).

- ``plugin``: the ``airflow.plugins`` entry point ``airflow_dataset_race_fix_ui``, which
  adds the page to the webserver on install. It only reads: it changes no scheduling and
  turns no fix on (that stays the opt-in of ``airflow_dataset_race_fix.plugin``);
- ``views``: the Flask AppBuilder view (Browse > Dataset runs), Airflow's RBAC per DAG;
- ``timeline``: the DAG page's picture, an SVG drawn on the server (no script, no CDN).
"""
