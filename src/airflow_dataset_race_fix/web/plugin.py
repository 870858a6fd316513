"""
The ``airflow.plugins`` entry point ``airflow_dataset_race_fix_ui``: the web page, on install.

Every Airflow process that loads plugins loads this module; only the webserver asks for the
page (``appbuilder_views``), and only then is Flask AppBuilder's view imported. The page
reads; nothing here turns the fix on (``airflow_dataset_race_fix.plugin`` is that opt-in).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

PLUGIN_NAME = "airflow_dataset_race_fix_ui"


class DatasetRunsPlugin(AirflowPlugin):
    """Browse > Dataset runs: why each dataset-triggered DAG runs next, or waits."""

    name = PLUGIN_NAME

    @property
    def appbuilder_views(self):  # the webserver's question; imports Flask AppBuilder only then
        if "_views" not in vars(self):
            from airflow_dataset_race_fix.web.views import DatasetRunsView

            self._views = [{"name": "Dataset runs", "category": "Browse", "view": DatasetRunsView()}]
        return self._views


plugin = DatasetRunsPlugin
