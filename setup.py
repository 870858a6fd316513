"""
setup.cfg holds the metadata; this says what it cannot: the series in patches/ is installed
inside the package, as ``airflow_dataset_race_fix/patches`` (``source_patches.locations``),
so that ``pip uninstall`` removes it with the package. As data files under
``<prefix>/share`` it left an empty ``share/airflow-dataset-race-fix/`` behind.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages("src"), "airflow_dataset_race_fix.patches"],
    package_dir={"": "src", "airflow_dataset_race_fix.patches": "patches"},
)
