"""
Pristine Airflow files from the release wheels, for the generator and the tests:
downloaded once with pip into a cache directory outside the repository, and checked
against each wheel's own RECORD.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from airflow_dataset_race_fix.source_patches.record import RecordError, parse_record, record_digest

CACHE_ENV = "ADRF_WHEEL_CACHE"


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "airflow-dataset-race-fix" / "wheels"


def wheel_path(version: str, cache: Path | None = None) -> Path:
    """The cached wheel of ``apache-airflow==version``, downloaded with pip on first use."""
    cache = cache or cache_dir()
    target = cache / f"apache_airflow-{version}-py3-none-any.whl"
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    # Download into a private directory, then rename: concurrent runs never see half a wheel.
    # Any Python may fetch any release's wheel (its files are read, never installed): 2.11.1
    # and later require Python 3.10, and the py39 envs read them too.
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                "--ignore-requires-python",
                f"apache-airflow=={version}",
                "-d",
                tmp,
            ],
            check=True,
        )
        wheels = list(Path(tmp).glob("apache_airflow-*.whl"))
        if len(wheels) != 1:
            raise RecordError(f"pip download of apache-airflow=={version} gave {[w.name for w in wheels]}")
        os.replace(wheels[0], target)
    return target


@dataclass(frozen=True)
class ReleaseFiles:
    """Files of one release, read from its wheel and checked against the wheel's RECORD."""

    version: str
    files: dict[str, bytes]
    dist_info_name: str
    record: bytes
    metadata: bytes


def release_files(version: str, paths: list[str], cache: Path | None = None) -> ReleaseFiles:
    with zipfile.ZipFile(wheel_path(version, cache)) as wheel:
        dist_info = f"apache_airflow-{version}.dist-info"
        record = wheel.read(f"{dist_info}/RECORD")
        hashes = parse_record(record.decode())
        files = {}
        for path in paths:
            data = wheel.read(path)
            if record_digest(data) != hashes.get(path):
                raise RecordError(f"{path} in the {version} wheel does not match the wheel's RECORD")
            files[path] = data
        return ReleaseFiles(version, files, dist_info, record, wheel.read(f"{dist_info}/METADATA"))


def make_site_packages(release: ReleaseFiles, root: Path) -> Path:
    """A minimal site-packages with the release's target files and its dist-info (for tests)."""
    for path, data in release.files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    dist_info = root / release.dist_info_name
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "RECORD").write_bytes(release.record)
    (dist_info / "METADATA").write_bytes(release.metadata)
    return root
