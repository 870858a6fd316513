"""
Pristine Airflow files: the RECORD of an installed Airflow, and release wheels.

An installed wheel's ``<dist>.dist-info/RECORD`` holds the sha256 of every file as the
release shipped it: that is how the applier tells a pristine target from a changed one.
The generator and the tests read the pristine files from the release wheels themselves,
downloaded once with pip into a cache directory outside the repository.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

DIST_PREFIX = "apache_airflow-"
CACHE_ENV = "ADRF_WHEEL_CACHE"


class RecordError(RuntimeError):
    pass


def record_digest(data: bytes) -> str:
    """A file's hash as RECORD writes it: ``sha256=<urlsafe base64, unpadded>``."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def record_to_hex(digest: str) -> str:
    """``sha256=<b64>`` -> hex, the form ``sha256sum`` prints."""
    b64 = digest.removeprefix("sha256=")
    return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()


def parse_record(text: str) -> dict[str, str]:
    return {row[0]: row[1] for row in csv.reader(io.StringIO(text)) if len(row) >= 2 and row[1]}


@dataclass(frozen=True)
class InstalledAirflow:
    site_packages: Path
    version: str
    dist_info: Path
    hashes: dict[str, str]  # path relative to site-packages -> "sha256=..."


def _metadata_version(metadata: str) -> str | None:
    match = re.search(r"^Version:\s*(\S+)\s*$", metadata, re.MULTILINE)
    return match.group(1) if match else None


def installed_airflow(site_packages: Path) -> InstalledAirflow:
    """The Airflow distribution installed in ``site_packages`` (read from files only)."""
    if not site_packages.is_dir():
        raise RecordError(f"{site_packages} is not a directory")
    dist_infos = sorted(
        p for p in site_packages.iterdir() if p.name.lower().startswith(DIST_PREFIX) and p.name.endswith(".dist-info")
    )
    if not dist_infos:
        raise RecordError(f"no apache-airflow installation (apache_airflow-*.dist-info) in {site_packages}")
    if len(dist_infos) > 1:
        names = ", ".join(p.name for p in dist_infos)
        raise RecordError(f"several apache-airflow installations in {site_packages} ({names}); reinstall Airflow")
    dist_info = dist_infos[0]
    try:
        version = _metadata_version((dist_info / "METADATA").read_text(encoding="utf-8"))
        record = (dist_info / "RECORD").read_text(encoding="utf-8")
    except OSError as err:
        raise RecordError(f"cannot read {dist_info}: {err}") from err
    if not version:
        raise RecordError(f"{dist_info / 'METADATA'} names no version")
    return InstalledAirflow(site_packages, version, dist_info, parse_record(record))


def default_site_packages() -> Path | None:
    """The site-packages of the running interpreter's Airflow (found, not imported)."""
    import importlib.util

    spec = importlib.util.find_spec("airflow")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


# -- release wheels ---------------------------------------------------------------------


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
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             f"apache-airflow=={version}", "-d", tmp],
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
