"""
The one series in ``patches/`` and the record of the releases it was verified against.

``series`` lists the patch files in order (quilt's format). ``verified-releases`` has one
tab-separated line per release and target file: the file's sha256 as the release ships
it and after the series is applied (``sha256sum``'s hex), which is how the applier knows
a pristine file and the exact result, without the fix's code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SERIES = "series"
VERIFIED = "verified-releases"
VERIFIED_COLUMNS = ("release", "path", "pristine sha256", "patched sha256")


class SeriesError(ValueError):
    """``series`` or ``verified-releases`` cannot be read."""


@dataclass(frozen=True)
class Verified:
    pristine: str  # hex sha256
    patched: str


def read_series(text: str) -> list[str]:
    """Patch file names in a quilt ``series`` (comments and options ignored)."""
    names = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line.split()[0])
    return names


def read_verified(path: Path) -> dict[str, dict[str, Verified]]:
    """release -> target path -> its two sha256s, from ``verified-releases``."""
    releases: dict[str, dict[str, Verified]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != len(VERIFIED_COLUMNS) or any(len(f) != 64 for f in fields[2:]):
            raise SeriesError(f"{path}, line {number}: expected {', '.join(VERIFIED_COLUMNS)}, tab-separated")
        release, target, pristine, patched = fields
        releases.setdefault(release, {})[target] = Verified(pristine, patched)
    return releases
