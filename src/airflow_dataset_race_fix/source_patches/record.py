"""
The RECORD of an installed Airflow: the sha256 of every file as the release shipped it.

An installed wheel's ``<dist>.dist-info/RECORD`` is how the applier tells a pristine
target from a changed one, reading files only (no import of Airflow).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
from dataclasses import dataclass
from pathlib import Path

DIST_PREFIX = "apache_airflow-"


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
        p
        for p in site_packages.iterdir()
        if p.name.lower().startswith(DIST_PREFIX) and p.name.endswith(".dist-info")
    )
    if not dist_infos:
        raise RecordError(f"no apache-airflow installation (apache_airflow-*.dist-info) in {site_packages}")
    if len(dist_infos) > 1:
        names = ", ".join(p.name for p in dist_infos)
        raise RecordError(
            f"several apache-airflow installations in {site_packages} ({names}); reinstall Airflow"
        )
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
