"""
Generate ``patches/`` from the fixed members: one source of truth with the shim.

For each target module, a release's pristine file is spliced: every replaced member
(decorators included, located with ``ast``) gives way to the fixed member's lines from
``airflow_dataset_race_fix.fix``, and every added member goes right after the member
before it in ``targets.MEMBERS``. The patch is the unified diff of the newest release's
pristine and spliced text, with paths relative to site-packages (``patch -p1 -d
<site-packages>``) and a DEP-3 header. The releases differ only away from the members,
so the one series must give every release's own splice (hunks at an offset, no fuzz):
that is checked here, and each target file's sha256 before and after is written to
``verified-releases``, which is what the applier checks instead of this splice.
"""

from __future__ import annotations

import datetime
import difflib
import hashlib
import re
import shutil
import textwrap
from dataclasses import dataclass
from pathlib import Path

from airflow_dataset_race_fix.source_patches import unidiff
from airflow_dataset_race_fix.source_patches.members import (
    dedented_sha256,
    fixed_member_lines,
    member_spans,
)
from airflow_dataset_race_fix.source_patches.series import SERIES, VERIFIED, VERIFIED_COLUMNS
from airflow_dataset_race_fix.targets import TARGET_MODULES, members_of

HAND_WRITTEN = ("README.md",)  # in patches/, beside what this module writes


class GenerationError(RuntimeError):
    """The pristine file is not what the fix was written for, or the series does not fit it."""


@dataclass(frozen=True)
class PatchSpec:
    number: int
    slug: str
    module: str
    subject: str
    body: str  # what and why, in short; the argument is BUG_REPORT.md's

    @property
    def filename(self) -> str:
        return f"{self.number:04d}-{self.slug}.patch"

    @property
    def path(self) -> str:
        return target_path(self.module)


def target_path(module: str) -> str:
    """``airflow.datasets.manager`` -> ``airflow/datasets/manager.py`` (relative to site-packages)."""
    return module.replace(".", "/") + ".py"


# One patch per target module, in series order. Each applies on its own, but they are one
# fix: 0002 deletes queue rows "as read", which is safe only with 0001's producers.
PATCHES = (
    PatchSpec(
        1,
        "forward-only-dataset-queue-upsert",
        "airflow.datasets.manager",
        "Dataset manager: forward-only queue rows and event stamps, written at commit",
        """
        What: a producer's DatasetDagRunQueue rows are written just before its COMMIT, in one
        upsert whose created_at only moves forward (PostgreSQL, MySQL/MariaDB, SQLite; other
        dialects keep the SAVEPOINT merge), and its dataset events are dated at commit on the
        database's clock, forward-only per dataset.
        .
        Why: stock Airflow keeps a stale queue row (ON CONFLICT DO NOTHING, or a merge that
        swallows IntegrityErrors) and dates events at flush time on the producer's clock, so a
        dataset-triggered run misses events that commit late: lost and doubled runs.
        """,
    ),
    PatchSpec(
        2,
        "scheduler-consumed-event-selection",
        "airflow.jobs.scheduler_job_runner",
        "Scheduler: dataset-triggered runs consume the events no run consumed yet",
        """
        What: a dataset-triggered run gets the events of its DAG's datasets that no run of
        the DAG consumed yet, is created only when the DAG's dataset condition holds on them,
        and the scheduler deletes the queue rows exactly as it read them (SKIP LOCKED, never
        waiting for a producer); a periodic sweep requeues DAGs with unqueued events, and a
        net that follows the event ids keeps each late commit it finds as a row of the log
        table until the run that consumes it commits.
        .
        Why: stock Airflow takes the events in a timestamp window, creates runs for empty
        windows and deletes every queue row of the DAG, so events committed late are never
        consumed, others are consumed twice, and rows queued meanwhile are lost. Apply with
        0001.
        """,
    ),
)

BUGS = tuple(f"https://github.com/apache/airflow/issues/{n}" for n in (56541, 41101, 35870, 54659, 56750))
REFERENCES = (
    "https://github.com/apache/airflow/pull/62501 (forward-only queue upsert, no empty runs)",
    "https://github.com/apache/airflow/pull/63939 (a 2.x backport, closed unmerged)",
    "https://github.com/apache/airflow/pull/60773 (delete only the queue rows read)",
)
LICENSE_NOTICE = """
This patch carries code of Apache Airflow, licensed to the Apache Software Foundation (ASF) under the
Apache License, Version 2.0 (http://www.apache.org/licenses/LICENSE-2.0), which the patched file's
header states in full; copyright ownership: Airflow's NOTICE file.
"""


# -- the splice --------------------------------------------------------------------------


def patched_source(module: str, pristine: str, version: str = "?") -> str:
    """``pristine`` (the release's text of ``module``) with the fixed members spliced in."""
    lines = pristine.splitlines(keepends=True)
    edits: list[tuple[int, int, list[str]]] = []  # (start, end, replacement), in member order
    anchor: dict[str, int] = {}  # owner -> end line of the last member placed
    spans = {owner: member_spans(lines, owner) for owner in {m.owner for m in members_of(module)}}
    for member in members_of(module):
        fixed = fixed_member_lines(member)
        span = spans[member.owner].get(member.name)
        where = f"{member.qualname} in apache-airflow {version}"
        if member.original_sha256 is None:
            if span is not None:
                raise GenerationError(f"{where}: the fix adds this member, but the release already has one")
            if member.owner not in anchor:
                raise GenerationError(
                    f"{where}: an added member must follow a replaced one in targets.MEMBERS"
                )
            edits.append((anchor[member.owner], anchor[member.owner], ["\n", *fixed]))
            continue
        if span is None:
            raise GenerationError(f"{where}: not found")
        found = dedented_sha256(lines[span[0] : span[1]])
        if found != member.original_sha256:
            raise GenerationError(
                f"{where}: source differs from the one the fix was written for "
                f"(sha256 {found}, expected {member.original_sha256})"
            )
        if _indent(lines[span[0]]) != _indent(fixed[0]):
            raise GenerationError(f"{where}: the fixed member is not indented as the original")
        edits.append((span[0], span[1], fixed))
        anchor[member.owner] = span[1]
    out: list[str] = []
    pos = 0
    for start, end, replacement in sorted(edits, key=lambda e: e[0]):  # stable: added keep order
        out.extend(lines[pos:start])
        out.extend(replacement)
        pos = end
    out.extend(lines[pos:])
    text = "".join(out)
    compile(text, target_path(module), "exec")  # a splice that does not compile is a bug here
    return text


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def unified_diff(path: str, old: str, new: str) -> str:
    """``difflib.unified_diff`` output, but without difflib's "popular line" heuristic.

    ``autojunk`` decides which lines are too common to anchor on from the length of the
    whole file, so the same change could align differently in two releases; without it,
    releases that differ only away from the patched members get the same hunks.
    """
    if not (old.endswith("\n") and new.endswith("\n")):
        raise GenerationError(f"{path}: files without a final newline are not supported")
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    out = [f"--- a/{path}\n", f"+++ b/{path}\n"]
    for group in difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(3):
        first, last = group[0], group[-1]
        out.append(f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@\n")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out.extend(" " + line for line in a[i1:i2])
                continue
            out.extend("-" + line for line in a[i1:i2])
            out.extend("+" + line for line in b[j1:j2])
    return "".join(out)


def _range(start: int, stop: int) -> str:
    """A hunk range as unified diff writes it (``difflib._format_range_unified``)."""
    length = stop - start
    first = start + 1 if length else start
    return str(first) if length == 1 else f"{first},{length}"


# -- patch files -------------------------------------------------------------------------

_LAST_UPDATE = re.compile(r"^Last-Update: (\S+)$", re.MULTILINE)


def _members_line(module: str) -> str:
    members = members_of(module)
    replaced = [m.name for m in members if m.original_sha256 is not None]
    owner = members[0].owner
    return (
        f"Replaces {owner}.{', '.join(replaced[:-1])}{' and ' if len(replaced) > 1 else ''}{replaced[-1]}; "
        f"adds {len(members) - len(replaced)} helper members."
    )


def _fix_file(spec: PatchSpec) -> str:
    return "src/airflow_dataset_race_fix/fix/" + target_path(spec.module).removeprefix("airflow/")


def _description(spec: PatchSpec) -> list[str]:
    paragraphs = [" ".join(p.split()) for p in textwrap.dedent(spec.body).strip().split("\n.\n")]
    paragraphs[0] += " " + _members_line(spec.module)
    paragraphs[-1] += " The scenarios and the argument: BUG_REPORT.md of airflow-dataset-race-fix."
    paragraphs.append("Upstream: " + "; ".join(REFERENCES) + ".")
    paragraphs.append(LICENSE_NOTICE.strip())
    lines = [f"Description: {spec.subject}"]
    for number, paragraph in enumerate(paragraphs):
        if number:
            lines.append(" .")
        rows = textwrap.wrap(
            " ".join(paragraph.split()), width=99, break_on_hyphens=False, break_long_words=False
        )
        lines.extend(" " + row for row in rows)
    return lines


def render_patch(spec: PatchSpec, version: str, pristine: str, last_update: str) -> str:
    header = [
        *_description(spec),
        "Author: airflow-dataset-race-fix contributors",
        f"Origin: vendor, generated from {_fix_file(spec)} by 'python -m tools.patchgen' "
        "(do not edit: regenerate)",
        *(f"Bug: {url}" for url in BUGS),
        "Forwarded: no",
        f"Last-Update: {last_update}",
        "---",
        "",
    ]
    diff = unified_diff(spec.path, pristine, patched_source(spec.module, pristine, version))
    return "\n".join(header) + "\n" + diff


def render_series(base: str) -> str:
    names = "".join(f"{spec.filename}\n" for spec in PATCHES)
    return (
        f"# Every release in {VERIFIED}; hunks at apache-airflow {base}'s lines, at an offset elsewhere.\n"
        "# Apply in this order: airflow-dataset-race-fix apply (checks, backups, atomic replace),\n"
        "# or one file after the other: patch -p1 -d <site-packages> < <file>\n" + names
    )


def render_verified(rows: list[tuple[str, str, str, str]]) -> str:
    return (
        "# The releases the series was verified against: each target file's sha256 (sha256sum)\n"
        "# as the release's wheel ships it and with the series applied. Generated; tab-separated.\n"
        "# " + "\t".join(VERIFIED_COLUMNS) + "\n" + "".join("\t".join(row) + "\n" for row in rows)
    )


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _apply_series(files: dict[str, str], spec: PatchSpec, pristine: str, version: str) -> str:
    _, file_patches = unidiff.parse(files[spec.filename])
    text = pristine
    try:
        for file_patch in file_patches:
            text = unidiff.apply(file_patch, text)
    except unidiff.PatchError as err:
        raise GenerationError(f"{spec.filename} does not apply to apache-airflow {version} ({err})") from err
    return text


def render(releases: dict[str, dict[str, bytes]], existing: Path | None = None) -> dict[str, str]:
    """File name -> text of ``patches/``: the series, made from the last (newest) release
    and verified against each of ``releases`` (version -> target path -> pristine bytes).

    Last-Update stays as committed while a patch's text is otherwise unchanged, so the
    output is reproducible; a patch that changes gets today's date.
    """
    base = list(releases)[-1]
    files = {SERIES: render_series(base)}
    for spec in PATCHES:
        text = releases[base][spec.path].decode("utf-8")
        old = existing / spec.filename if existing else None
        old_text = old.read_text(encoding="utf-8") if old and old.is_file() else ""
        match = _LAST_UPDATE.search(old_text)
        candidate = render_patch(spec, base, text, match.group(1)) if match else None
        if candidate != old_text:
            candidate = render_patch(spec, base, text, datetime.date.today().isoformat())
        files[spec.filename] = candidate
    rows = []
    for version, pristine_files in releases.items():
        for spec in PATCHES:
            pristine = pristine_files[spec.path].decode("utf-8")
            patched = patched_source(spec.module, pristine, version)
            if _apply_series(files, spec, pristine, version) != patched:
                raise GenerationError(
                    f"{spec.filename}, made from apache-airflow {base}, does not give the fix on {version}: "
                    "that release needs a variant of its own"
                )
            rows.append((version, spec.path, _sha256(pristine), _sha256(patched)))
    files[VERIFIED] = render_verified(rows)
    return files


def target_paths() -> list[str]:
    return [target_path(module) for module in TARGET_MODULES]


def _stale(patches_dir: Path, files: dict[str, str]) -> list[Path]:
    """What an earlier generator wrote that this one does not: other patch files, and the
    per-release directories of the old layout (a version-named directory with a series)."""
    if not patches_dir.is_dir():
        return []
    return sorted(
        path
        for path in patches_dir.iterdir()
        if path.name not in files
        and path.name not in HAND_WRITTEN
        and (
            path.suffix == ".patch"
            or (re.fullmatch(r"\d+\.\d+\.\d+", path.name) and (path / SERIES).is_file())
        )
    )


def differences(patches_dir: Path, generated: dict[str, str]) -> list[str]:
    """What in ``patches_dir`` differs from ``generated`` (file name -> text); empty if none."""
    problems = []
    for name, text in generated.items():
        path = patches_dir / name
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{path}: differs from the generated file")
    if patches_dir.is_dir():
        problems.extend(
            f"{extra}: not generated"
            for extra in sorted(patches_dir.iterdir())
            if extra.name not in generated and extra.name not in HAND_WRITTEN
        )
    return problems


def write(patches_dir: Path, files: dict[str, str]) -> list[str]:
    """Write the files that changed and remove stale ones; says what it did."""
    patches_dir.mkdir(parents=True, exist_ok=True)
    done = []
    for name, text in files.items():
        path = patches_dir / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            done.append(f"wrote {path}")
    for path in _stale(patches_dir, files):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
        done.append(f"removed {path}")
    return done
