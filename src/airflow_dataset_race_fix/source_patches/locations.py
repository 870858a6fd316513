"""
Where the ``patches/`` directory is: ``$ADRF_PATCHES_DIR``, the source tree this package
runs from (a checkout or an editable install), or the copy a wheel installs in this package
(``airflow_dataset_race_fix/patches``: setup.py).
"""

from __future__ import annotations

import os
from pathlib import Path

PATCHES_ENV = "ADRF_PATCHES_DIR"


def repo_patches_dir() -> Path | None:
    """``<repo>/patches`` for a checkout or an editable install (``src/`` layout)."""
    repo = Path(__file__).resolve().parents[3]
    if (repo / "setup.cfg").is_file() and (repo / "patches").is_dir():
        return repo / "patches"
    return None


def installed_patches_dir() -> Path | None:
    path = Path(__file__).resolve().parents[1] / "patches"
    return path if path.is_dir() else None


def default_patches_dir() -> Path | None:
    if os.environ.get(PATCHES_ENV):
        return Path(os.environ[PATCHES_ENV])
    return repo_patches_dir() or installed_patches_dir()
