"""
Make this clone's root importable in every process of the running Python's environment: a
``.pth`` file in its site-packages. The lab (``reproduce``) and the tools are not in the wheel;
the Airflow processes that tests and ``reproduce/run`` start (a scheduler, ``airflow db``,
children started without our PYTHONPATH) read the SQLite test settings from
``reproduce.harness.database``. Run by tox (commands_pre) and ``reproduce/run``.
"""

import pathlib
import sysconfig

ROOT = pathlib.Path(__file__).resolve().parents[1]
pathlib.Path(sysconfig.get_paths()["purelib"], "airflow_dataset_race_fix_clone.pth").write_text(f"{ROOT}\n")
