"""
The ``airflow.plugins`` entry point ``airflow_dataset_race_fix_ui``: the web page, on install.

Every Airflow process that loads plugins loads this module; only the webserver asks for the
page (``appbuilder_views``), and only then is Flask AppBuilder's view imported. The page
reads; nothing here turns the fix on (``airflow_dataset_race_fix.plugin`` is that opt-in). Its
listener makes each component and task process say whether its code is fixed.
"""

from __future__ import annotations

import sys

from airflow.listeners import hookimpl
from airflow.plugins_manager import AirflowPlugin

PLUGIN_NAME = "airflow_dataset_race_fix_ui"


# This module is the plugin's listener: each component as it starts (a Job, 'tasks run') and each
# task process (in its own task log) says once whether its code is fixed, and if not, why; the
# components that schedule, and each task with outlets, leave a mark (evidence.py).
_in_task = False  # a task command runs here: its Job is a task's, even in a child of 'airflow scheduler'


@hookimpl
def on_starting(component) -> None:
    global _in_task
    from airflow_dataset_race_fix import evidence, runtime, verdict

    verdict.announce_process()
    _in_task = _in_task or type(component).__name__ == "TaskCommandMarker"
    command = None if _in_task else runtime.command_name()
    if command in ("scheduler", "triggerer", "dag-processor") and hasattr(component, "start_date"):
        evidence.mark_component(command, component.start_date)  # its Job row has the same host and start


@hookimpl
def on_task_instance_running(previous_state, task_instance) -> None:
    from airflow_dataset_race_fix import evidence, verdict

    verdict.announce_process()
    evidence.mark_producer(task_instance)


class DatasetRunsPlugin(AirflowPlugin):
    """Browse > Dataset runs: why each dataset-triggered DAG runs next, or waits."""

    name = PLUGIN_NAME
    listeners = [sys.modules[__name__]]

    @property
    def appbuilder_views(self):  # the webserver's question; imports Flask AppBuilder only then
        if "_views" not in vars(self):
            from airflow_dataset_race_fix import evidence, runtime, verdict
            from airflow_dataset_race_fix.web.views import DatasetRunsView, fix_active_here

            verdict.announce_process()  # each webserver worker: it serves the REST API's dataset events
            if runtime.command_name() != "":  # gunicorn's worker, not a short 'airflow users ...' command
                evidence.mark_component("webserver")
                # judged as the worker starts (it reads source: 0.3 s), not in its first request
                fix_active_here()
            self._views = [{"name": "Dataset runs", "category": "Browse", "view": DatasetRunsView()}]
        return self._views


plugin = DatasetRunsPlugin
