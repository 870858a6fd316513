"""
``import airflow_dataset_race_fix.auto``: turn the shim on from your own code.

Same hooks as the PYTHONPATH and ``.pth`` routes, honouring the same switches; import it
before or after Airflow. In strict mode (``AIRFLOW_DATASET_RACE_FIX_STRICT=1``) this
import raises ``RefusedError`` if a target already imported cannot be patched.
"""

from airflow_dataset_race_fix.bootstrap import ROUTE_IMPORT, start

start(ROUTE_IMPORT)
