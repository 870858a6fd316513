"""
Apply, revert and check the source patches in a site-packages directory; what they guarantee:
docs/source-patches.md. Everything is decided before anything is written (the version, each
target's RECORD hash and ``verified-releases``, the series' exact result); a state this module
cannot explain is refused, naming the file and what to do, and nothing is changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from airflow_dataset_race_fix import __version__
from airflow_dataset_race_fix.source_patches import unidiff
from airflow_dataset_race_fix.source_patches.record import (
    InstalledAirflow,
    RecordError,
    installed_airflow,
    record_digest,
    record_to_hex,
)
from airflow_dataset_race_fix.source_patches.safe_write import (
    NotWritable,
    atomic_write,
    check_writable,
    cleanup_stale_temps,
    fsync_dir,
    locked,
    refresh_bytecode,
    replace_all,
    step_point,
)
from airflow_dataset_race_fix.source_patches.series import (
    SERIES,
    VERIFIED,
    SeriesError,
    Verified,
    read_series,
    read_verified,
)
from airflow_dataset_race_fix.targets import SUPPORTED_AIRFLOW_VERSIONS, release_of

PRISTINE = "pristine"  # the release's file, as its RECORD says
PATCHED = "patched"  # the release's file with this package's patches
OTHER_FIX = "patched by another version of the fix"  # our earlier apply, from backups
MODIFIED = "modified"  # neither: refused
MISSING = "missing"
INTERRUPTED = "missing while an interrupted apply or revert swapped it"  # pristine bytes in the backups

BACKUP_DIR = ".airflow-dataset-race-fix"  # in site-packages: pristine copies + manifest
MANIFEST = "applied.json"
JOURNAL = "in-progress.json"  # present while target files are being swapped

# The target whose file is absent while the targets disagree: without it no scheduler
# starts, which strands nothing; without the manager's file no task could run.
SWAPPED_LAST = "airflow/jobs/scheduler_job_runner.py"


class Refused(RuntimeError):
    """The operation cannot be done safely; nothing was changed."""


@dataclass
class PatchFile:
    name: str
    path: Path
    text: str
    files: list[unidiff.FilePatch]


@dataclass
class Target:
    path: str  # relative to site-packages
    patches: list[PatchFile]
    expected: str  # RECORD digest of the pristine file
    verified: Verified  # its sha256s in verified-releases: pristine, and with the series
    found: str | None = None  # RECORD-style digest of the file now; None if missing
    state: str = MISSING
    pristine: bytes | None = None
    patched: bytes | None = None

    @property
    def patch_names(self) -> str:
        return ", ".join(p.name for p in self.patches)


@dataclass
class Inspection:
    airflow: InstalledAirflow
    patches_dir: Path
    series: list[PatchFile]
    targets: list[Target] = field(default_factory=list)
    interrupted: dict | None = None  # the journal of an apply or revert that did not finish

    @property
    def version(self) -> str:
        return self.airflow.version

    @property
    def backup_root(self) -> Path:
        return self.airflow.site_packages / BACKUP_DIR

    @property
    def states(self) -> set[str]:
        return {t.state for t in self.targets}

    @property
    def summary(self) -> str:
        if self.interrupted is not None:
            return (
                f"interrupted ({self.interrupted.get('operation', 'a change')} did not finish): run "
                "'airflow-dataset-race-fix apply' or 'revert' to finish it"
            )
        states = self.states
        if states == {PATCHED}:
            return "applied"
        if states == {PRISTINE}:
            return "not applied"
        if states <= {PATCHED, OTHER_FIX}:
            return "applied by another version of airflow-dataset-race-fix (run apply to update)"
        if states <= {PRISTINE, PATCHED, OTHER_FIX}:
            return "half applied"
        return "needs attention"


# -- inspection (the dry run) ------------------------------------------------------------
def _sha(digest: str | None) -> str:
    return "none (file missing)" if digest is None else f"sha256 {record_to_hex(digest)}"


def load_series(patches_dir: Path) -> list[PatchFile]:
    series_file = patches_dir / SERIES
    if not series_file.is_file():
        old_layout = (
            sorted(d.parent.name for d in patches_dir.glob(f"*/{SERIES}")) if patches_dir.is_dir() else []
        )
        if old_layout:
            raise Refused(
                f"{patches_dir} has one series per release ({', '.join(old_layout)}), the layout of earlier "
                "versions of airflow-dataset-race-fix; this version applies the one series of its own "
                f"patches/ ({SERIES}, the patch files and {VERIFIED}): omit --patches-dir or pass that "
                "directory; nothing was changed"
            )
        raise Refused(f"no source patches in {patches_dir} ({series_file} is missing); nothing was changed")
    series = []
    for name in read_series(series_file.read_text(encoding="utf-8")):
        path = patches_dir / name
        try:
            text = path.read_text(encoding="utf-8")
            _, files = unidiff.parse(text)
        except (OSError, UnicodeDecodeError, unidiff.PatchError) as err:
            raise Refused(
                f"patch file {path} cannot be read as a patch ({err}); restore it from the repository "
                "or regenerate it there with 'python -m tools.patchgen'; nothing was changed"
            ) from err
        series.append(PatchFile(name, path, text, files))
    if not series:
        raise Refused(f"{series_file} lists no patch; nothing was changed")
    return series


def load_verified(patches_dir: Path, version: str) -> dict[str, Verified]:
    """Target path -> its recorded sha256s for ``version``."""
    path = patches_dir / VERIFIED
    if not path.is_file():
        raise Refused(
            f"{patches_dir} has no {VERIFIED} (the sha256s the series was verified against): it is not the "
            "patches/ of this version of airflow-dataset-race-fix; omit --patches-dir or restore patches/ "
            "from the repository; nothing was changed"
        )
    try:
        releases = read_verified(path)
    except (OSError, UnicodeDecodeError, SeriesError) as err:
        raise Refused(
            f"{path} cannot be read ({err}): it records the files the series was verified against; "
            "restore patches/ from the repository; nothing was changed"
        ) from err
    if version not in releases:
        raise Refused(
            f"the series in {patches_dir} was not verified against apache-airflow {version} ({path} lists "
            f"{', '.join(releases) or 'no release'}); nothing was changed"
        )
    return releases[version]


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _read_manifest(backup_root: Path) -> dict:
    return _read_json(backup_root / MANIFEST) or {}


def _backed_up_pristine(target: Target, backup_root: Path) -> bytes | None:
    backup = backup_root / target.path
    if backup.is_file():
        saved = backup.read_bytes()
        if record_digest(saved) == target.expected:
            return saved
    return None


def _pristine_text(target: Target, current: bytes, manifest: dict, backup_root: Path) -> bytes | None:
    """The pristine bytes behind ``current``, when they can be proven (RECORD hash)."""
    if record_digest(current) == target.expected:
        return current
    entry = manifest.get("files", {}).get(target.path, {})
    if record_digest(current) in (entry.get("patched"), *entry.get("earlier", ())):
        saved = _backed_up_pristine(target, backup_root)
        if saved is not None:
            return saved  # our own earlier apply, whatever the patch files say now
    text = current.decode("utf-8", errors="surrogateescape")
    try:
        for patch in reversed(target.patches):
            for file_patch in patch.files:
                if file_patch.path == target.path:
                    text = unidiff.apply(file_patch, text, reverse=True)
    except unidiff.PatchError:
        return None
    candidate = text.encode("utf-8", errors="surrogateescape")
    return candidate if record_digest(candidate) == target.expected else None


def _forward(target: Target, pristine: bytes, version: str) -> str:
    text = pristine.decode("utf-8")
    for patch in target.patches:
        for file_patch in patch.files:
            if file_patch.path == target.path:
                try:
                    text = unidiff.apply(file_patch, text)
                except unidiff.PatchError as err:
                    raise Refused(
                        f"patch file {patch.path} does not fit the pristine {target.path} of "
                        f"apache-airflow {version} ({err}); it was edited by hand or belongs to another "
                        "release: restore it from the repository or regenerate it there with "
                        "'python -m tools.patchgen'; nothing was changed"
                    ) from err
    return text


def inspect(site_packages: Path, patches_dir: Path) -> Inspection:
    """Everything apply/revert/check need to know; reads only."""
    try:
        airflow = installed_airflow(site_packages)
    except RecordError as err:
        raise Refused(f"{err}; nothing was changed") from err
    release = release_of(
        airflow.version
    )  # a local build (2.10.5+astro.3) is judged by its files, as its release
    if release is None:
        raise Refused(
            f"apache-airflow {airflow.version} in {site_packages} is not supported: the source patches "
            f"cover {', '.join(SUPPORTED_AIRFLOW_VERSIONS)}; nothing was changed. Use a supported "
            "Airflow, or a release of airflow-dataset-race-fix that supports yours"
        )
    series = load_series(patches_dir)
    verified = load_verified(patches_dir, release)
    result = Inspection(airflow, patches_dir, series)
    paths = list(dict.fromkeys(fp.path for patch in series for fp in patch.files))
    if sorted(paths) != sorted(verified):
        raise Refused(
            f"the series in {patches_dir} patches {', '.join(paths)}, but the fix needs "
            f"{', '.join(verified)}: restore patches/ from the repository; nothing was changed"
        )
    manifest = _read_manifest(result.backup_root)
    if (result.backup_root / JOURNAL).exists():
        result.interrupted = _read_json(result.backup_root / JOURNAL) or {}
    for path in paths:
        if path not in airflow.hashes:
            raise Refused(f"{path} is not in {airflow.dist_info / 'RECORD'}; nothing was changed")
        if record_to_hex(airflow.hashes[path]) != verified[path].pristine:
            raise Refused(
                f"{path} of apache-airflow {airflow.version} in {site_packages} is not the file the series "
                f"was verified against: {airflow.dist_info.name}/RECORD says {_sha(airflow.hashes[path])}, "
                f"{patches_dir / VERIFIED} records sha256 {verified[path].pristine} "
                "(a rebuilt distribution?); nothing was changed"
                + (
                    f": this local build of {release} changed it, and audit, explain and the "
                    "page still read its database"
                    if release != airflow.version
                    else ""
                )
            )
        patches = [p for p in series if any(fp.path == path for fp in p.files)]
        target = Target(path, patches, airflow.hashes[path], verified[path])
        _inspect_target(target, result, manifest)
        result.targets.append(target)
    return result


def _inspect_target(target: Target, inspection: Inspection, manifest: dict) -> None:
    """Set the target's state, and its pristine and patched bytes when they can be proven."""
    file = inspection.airflow.site_packages / target.path
    if file.is_file():
        current = file.read_bytes()
        target.found = record_digest(current)
        pristine = _pristine_text(target, current, manifest, inspection.backup_root)
        if pristine is None:
            target.state = MODIFIED
            return
    elif inspection.interrupted is not None:
        current = None
        pristine = _backed_up_pristine(target, inspection.backup_root)
        if pristine is None:
            return  # MISSING
    else:
        return  # MISSING
    target.pristine = pristine
    # The series must give exactly the file it was verified to give (generated from the fix).
    target.patched = _forward(target, pristine, inspection.version).encode("utf-8")
    found = hashlib.sha256(target.patched).hexdigest()
    if found != target.verified.patched:
        raise Refused(
            f"patch file {target.patches[0].path} differs from the fix in this package "
            f"(airflow-dataset-race-fix {__version__}): it makes the pristine {target.path} of "
            f"apache-airflow {inspection.version} into sha256 {found}, not the sha256 "
            f"{target.verified.patched} that {inspection.patches_dir / VERIFIED} records. It was "
            "edited by hand or is stale. Restore it from the repository or regenerate it there with "
            "'python -m tools.patchgen'; nothing was changed"
        )
    if current is None:
        target.state = INTERRUPTED
    elif current == pristine:
        target.state = PRISTINE
    elif current == target.patched:
        target.state = PATCHED
    else:
        target.state = OTHER_FIX


def _refuse_unexplained(inspection: Inspection) -> None:
    """Refuse, naming every target that is neither pristine nor patched."""
    problems = []
    for t in inspection.targets:
        if t.state == MODIFIED:
            problems.append(
                f"{inspection.airflow.site_packages / t.path} is neither the pristine apache-airflow "
                f"{inspection.version} file nor the one its patches ({t.patch_names}) produce: expected "
                f"{_sha(t.expected)} (from {inspection.airflow.dist_info.name}/RECORD) or that file with "
                f"the patches applied, found {_sha(t.found)}. Something else changed it (a hand edit, "
                "another patch, a custom build)"
            )
        elif t.state == MISSING:
            problems.append(
                f"{inspection.airflow.site_packages / t.path} is missing (expected {_sha(t.expected)})"
            )
    if problems:
        raise Refused(
            "; ".join(problems) + ". Nothing was changed. To start from the release again: "
            f"pip install --force-reinstall --no-deps apache-airflow=={inspection.version}, then apply"
        )


# -- operations --------------------------------------------------------------------------
@dataclass
class Outcome:
    message: str
    changed: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _write_backups(inspection: Inspection) -> None:
    """Pristine copies and a manifest, written before any target is touched. The manifest
    keeps the digests of earlier patched files, which an interrupted update leaves."""
    root = inspection.backup_root
    previous = _read_manifest(root).get("files", {})
    manifest = {
        "apache-airflow": inspection.version,
        "airflow-dataset-race-fix": __version__,
        "patches": {p.name: hashlib.sha256(p.text.encode()).hexdigest() for p in inspection.series},
        "files": {},
    }
    for t in inspection.targets:
        backup = root / t.path
        backup.parent.mkdir(parents=True, exist_ok=True)
        if not backup.is_file() or backup.read_bytes() != t.pristine:
            atomic_write(backup, t.pristine)
        patched = record_digest(t.patched)
        entry = previous.get(t.path, {})
        earlier = dict.fromkeys(
            d for d in (entry.get("patched"), *entry.get("earlier", ())) if d and d != patched
        )
        manifest["files"][t.path] = {"pristine": t.expected, "patched": patched, "earlier": list(earlier)}
        step_point()
    atomic_write(root / MANIFEST, json.dumps(manifest, indent=2).encode() + b"\n")


def _swap(inspection: Inspection, operation: str, writes: list[tuple[Target, bytes]]) -> list[str]:
    """Give each target its new bytes under a journal; returns bytecode warnings."""
    site_packages = inspection.airflow.site_packages
    journal = inspection.backup_root / JOURNAL
    atomic_write(journal, json.dumps({"operation": operation, "files": [t.path for t, _ in writes]}).encode())
    step_point()
    writes = sorted(writes, key=lambda write: write[0].path == SWAPPED_LAST)
    current = {
        t.path: (site_packages / t.path).read_bytes() if t.state != INTERRUPTED else None for t, _ in writes
    }
    if writes:
        replace_all([(site_packages / t.path, new, current[t.path]) for t, new in writes])
    warnings = [w for t, _ in writes if (w := refresh_bytecode(site_packages / t.path))]
    step_point()
    journal.unlink()
    fsync_dir(journal.parent)
    step_point()
    return warnings


def _require_writable(directories: list[Path]) -> None:
    try:
        check_writable(directories)
    except NotWritable as err:
        raise Refused(
            f"{err}; the site-packages is read-only for this user. Run as the user that owns the "
            "installation (in an image build: before dropping privileges, or before the file system "
            "is made read-only); nothing was changed"
        ) from err


def _target_dirs(inspection: Inspection) -> list[Path]:
    """Where our temporary files can be left by a kill: beside the targets and their backups."""
    site_packages = inspection.airflow.site_packages
    return [
        directory
        for t in inspection.targets
        for directory in ((site_packages / t.path).parent, (site_packages / BACKUP_DIR / t.path).parent)
    ]


def _finishing(inspection: Inspection) -> str:
    """The message prefix of a command that finishes (or undoes) an interrupted one."""
    if inspection.interrupted is None:
        return ""
    return f"finished the interrupted {inspection.interrupted.get('operation', 'change')}: "


def check(site_packages: Path, patches_dir: Path, on_wait=None) -> Inspection:
    """:func:`inspect`, after any apply or revert in progress has finished."""
    with locked(site_packages, shared=True, on_wait=on_wait):
        return inspect(site_packages, patches_dir)


def apply(site_packages: Path, patches_dir: Path, dry_run: bool = False, on_wait=None) -> Outcome:
    with locked(site_packages, on_wait=on_wait):
        inspection = inspect(site_packages, patches_dir)
        _refuse_unexplained(inspection)
        names = ", ".join(p.name for p in inspection.series)
        states = inspection.states
        interrupted = inspection.interrupted is not None
        if states == {PATCHED} and not interrupted:
            return Outcome(
                f"already applied: apache-airflow {inspection.version} in {site_packages} has {names}"
            )
        # All pristine: apply. All patched, some by an earlier release of this package: update
        # (the pristine bytes are proven by the backups). After an interrupted apply or revert:
        # finish it. Any other mix with pristine files: refuse.
        if not interrupted and states != {PRISTINE} and not states <= {PATCHED, OTHER_FIX}:
            listing = "; ".join(f"{t.path} ({t.patch_names}): {t.state}" for t in inspection.targets)
            raise Refused(
                f"the source patches are half applied in {site_packages} ({listing}). Nothing was changed: "
                "run 'airflow-dataset-race-fix revert' to return to the pristine release, then 'apply'"
            )
        to_write = [t for t in inspection.targets if t.state != PATCHED]
        if interrupted:
            verb = f"{_finishing(inspection)}applied"
        else:
            verb = "applied" if states == {PRISTINE} else "updated (from another version of the fix)"
        _require_writable([*_target_dirs(inspection), inspection.backup_root])
        changed = [t.path for t in to_write]
        if dry_run:
            return Outcome(
                f"dry run: would have {verb} {names} for apache-airflow {inspection.version}", changed
            )
        warnings = _write(inspection, "apply", [(t, t.patched) for t in to_write])
        return Outcome(
            f"{verb} {names} to apache-airflow {inspection.version} in {site_packages}", changed, warnings
        )


def revert(site_packages: Path, patches_dir: Path, dry_run: bool = False, on_wait=None) -> Outcome:
    with locked(site_packages, on_wait=on_wait):
        inspection = inspect(site_packages, patches_dir)
        _refuse_unexplained(inspection)
        to_restore = [t for t in inspection.targets if t.state != PRISTINE]
        if not to_restore and inspection.interrupted is None:
            if not dry_run:
                _remove_backups(inspection)
            return Outcome(f"not applied: apache-airflow {inspection.version} in {site_packages} is pristine")
        _require_writable([*_target_dirs(inspection), inspection.backup_root])
        changed = [t.path for t in to_restore]
        if dry_run:
            return Outcome(f"dry run: would restore the pristine {', '.join(changed)}", changed)
        warnings = _write(inspection, "revert", [(t, t.pristine) for t in to_restore])
        _remove_backups(inspection)
        pristine = f"apache-airflow {inspection.version} in {site_packages} is pristine"
        return Outcome(f"{_finishing(inspection)}reverted: {pristine}", changed, warnings)


def _write(inspection: Inspection, kind: str, contents: list[tuple[Target, bytes]]) -> list[str]:
    """Replace the targets with ``contents`` (target, bytes), backups first; the swap's warnings."""
    cleanup_stale_temps(_target_dirs(inspection))
    # The backups let the next command restore a file that a SIGKILL left absent.
    _write_backups(inspection)
    return _swap(inspection, kind, contents)


def _remove_backups(inspection: Inspection) -> None:
    """Backups are only needed while a patched file exists."""
    root = inspection.backup_root
    if not root.is_dir():
        return
    with contextlib.suppress(OSError):
        for t in inspection.targets:
            (root / t.path).unlink(missing_ok=True)
            step_point()
        (root / MANIFEST).unlink(missing_ok=True)
        for directory in sorted((d for d in root.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
            directory.rmdir()
        root.rmdir()


def describe(inspection: Inspection) -> list[str]:
    """One line per target for ``check`` (and ``status``)."""
    return [
        f"{t.path}: {t.state} ({t.patch_names}; found {_sha(t.found)}, pristine {_sha(t.expected)})"
        for t in inspection.targets
    ]
