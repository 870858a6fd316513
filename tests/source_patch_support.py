"""
Helpers for the source patch tests: pristine release files from the cached wheels, and
a throw-away site-packages holding just the target files and Airflow's dist-info.

Wheels are downloaded with pip once into ``$ADRF_WHEEL_CACHE`` (default
``~/.cache/airflow-dataset-race-fix/wheels``) and reused by every later run.
"""

from __future__ import annotations

import functools
from pathlib import Path

from airflow_dataset_race_fix.source_patches.locations import repo_patches_dir
from tools.patchgen import generator, wheels

PATCHES_DIR = repo_patches_dir()


@functools.lru_cache(maxsize=None)
def release(version: str) -> wheels.ReleaseFiles:
    return wheels.release_files(version, generator.target_paths())


def site_packages(version: str, root: Path) -> Path:
    return wheels.make_site_packages(release(version), root / "site-packages")


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> bytes), to prove nothing changed."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
