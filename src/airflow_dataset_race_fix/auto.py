"""
``import airflow_dataset_race_fix.auto``: turn the shim on from your own code.

Same hooks as the PYTHONPATH and ``.pth`` routes, honouring the same switches; import it
before or after Airflow. In strict mode (``AIRFLOW_DATASET_RACE_FIX_STRICT=1``) this
import raises ``RefusedError`` if a target already imported cannot be patched.

In ``airflow_local_settings.py`` (``$AIRFLOW_HOME/config/`` or the plugins folder) it runs
in every Airflow process, while ``import airflow`` runs and before any target module is
imported; ``status`` then names the route ``airflow_local_settings``.
"""

import sys

from airflow_dataset_race_fix.bootstrap import ROUTE_IMPORT, ROUTE_LOCAL_SETTINGS, start


def _route() -> str:
    # Airflow imports the module named airflow_local_settings; its frame is below ours.
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == "airflow_local_settings":
            return ROUTE_LOCAL_SETTINGS
        frame = frame.f_back
    return ROUTE_IMPORT


start(_route())
