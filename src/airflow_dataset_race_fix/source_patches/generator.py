"""
Generate ``patches/<version>/`` from the fixed members: one source of truth with the shim.

For each target module, the pristine release file is spliced: every replaced member
(decorators included, located with ``ast``) gives way to the fixed member's lines from
``airflow_dataset_race_fix.fix``, and every added member goes right after the member
before it in ``targets.MEMBERS``. The patch is the unified diff of pristine and spliced
text, with paths relative to site-packages (``patch -p1 -d <site-packages>``) and a
DEP-3 header. The same splice is what the applier checks a patch file against.
"""

from __future__ import annotations

import datetime
import difflib
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from airflow_dataset_race_fix.source_patches.members import (
    dedented_sha256,
    fixed_member_lines,
    member_spans,
)
from airflow_dataset_race_fix.targets import SUPPORTED_AIRFLOW_VERSIONS, TARGET_MODULES, members_of


class GenerationError(RuntimeError):
    """The pristine file is not what the fix was written for."""


@dataclass(frozen=True)
class PatchSpec:
    number: int
    slug: str
    module: str
    subject: str
    body: str  # long description, paragraphs separated by blank lines

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
        DatasetManager._queue_dagruns writes one DatasetDagRunQueue row per consuming DAG
        in the producer's transaction. Stock Airflow keeps an existing row as it is (ON
        CONFLICT DO NOTHING on PostgreSQL, a merge in a SAVEPOINT elsewhere): its
        created_at goes stale while new events arrive, so the run it triggers misses
        them, and concurrent producers on MySQL and SQLite swallow IntegrityErrors and
        keep the stale row.

        Remember the queue rows on the session (new helper _defer_queue_dagruns) and
        write all of a transaction's rows just before its COMMIT, after its other
        writes, in one upsert in (dataset_id, target_dag_id) order on PostgreSQL,
        MySQL/MariaDB and SQLite (new helper _upsert_queue_dagruns, chunked for each
        backend's statement limits), whose created_at only moves forward: to the
        producer's clock, or one microsecond past the stored value when that clock is
        behind. Every write changes the row, which lets the scheduler (0002) delete a
        queue row only as it read it. One global lock order, held only for the COMMIT:
        tasks with several outlets, in any order, cannot deadlock each other. A rolled
        back transaction or SAVEPOINT forgets the rows it registered (session event
        listeners _write_at_commit, _forget_rolled_back_queue_rows,
        _forget_ended_queue_rows). Other dialects keep the SAVEPOINT merge.

        Event timestamps were the flush time on the producer host's clock, so an event
        that committed late could hide anywhere behind events the scheduler already
        took. register_dataset_change now remembers its event (new helper
        _stamp_at_commit), and the last statements before the COMMIT, after the queue
        upsert, date the transaction's events on the database's clock (PostgreSQL
        clock_timestamp(), MySQL/MariaDB NOW(6), SQLite the host's), forward-only per
        dataset (new helpers _database_clock, _database_now, _stamp_events). Queue rows
        are dated on the same clock. With 0002 this lets the scheduler read only new
        events instead of a 900 s window.

        A queue row another transaction holds (another producer's COMMIT of the same
        row) is left as it is (after [dataset_race_fix] queue_row_wait_seconds of trying
        again with SKIP LOCKED, default 0; new helpers _upsert_queue_rows_not_held,
        _busy_queue_rows): the committed row keeps the DAG queued, so one stalled producer
        no longer holds up the other producers of its dataset. On PostgreSQL the take, the
        check and the upsert are one statement, and the stamp another.
        """,
    ),
    PatchSpec(
        2,
        "scheduler-consumed-event-selection",
        "airflow.jobs.scheduler_job_runner",
        "Scheduler: dataset-triggered runs consume the events no run consumed yet",
        """
        SchedulerJobRunner._create_dag_runs_dataset_triggered gave a run the events in
        the timestamp window (previous run, newest queue row], created a run even when
        that window was empty, and deleted every queue row of the DAG. Timestamps are
        taken at flush time while rows become visible at commit time, so an event
        committed late was never consumed, a late queue row made a run consume events
        again, and rows queued while the run was created were deleted unconsumed.

        Select the events of the DAG's datasets that no run of the DAG consumed yet,
        above a floor per dataset: the newest event of it the latest run consumed (or its
        queue row, if older) minus [dataset_race_fix] commit_latency_seconds (default 10),
        which 0001's commit stamps make safe; the latest run minus [dataset_race_fix]
        event_lookback_seconds (default 900) for a dataset the latest run did not consume
        and, as a safety net, once per [dataset_race_fix] full_read_interval_seconds
        (default 300) per DAG. Judge "ahead" against the database's clock. Create a run
        only when the DAG's dataset
        condition holds on them, keep runs in logical-date order, and delete the queue
        rows exactly as read, for all DAGs of the loop at its end (new helper
        _delete_dataset_queue_rows_as_read): taken FOR UPDATE SKIP LOCKED (PostgreSQL,
        MySQL 8, MariaDB 10.6+) and deleted by primary key, so the scheduler never waits
        for a producer. Statements are chunked for each backend's limits.

        Queue rows of events dated ahead of the database's clock are deleted like the
        others, so that DAGs kept waiting take no slot from DAGs that can run; the
        sweep (new helper _dags_with_unqueued_dataset_events, called from
        _create_dagruns_for_dags every [dataset_race_fix] requeue_interval_seconds)
        adds to the loop's dataset-triggered DAGs those with an event newer than their
        latest run on a dataset without a queue row for them. Apply with 0001.
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
This patch carries code of Apache Airflow. Licensed to the Apache Software Foundation
(ASF) under one or more contributor license agreements. See the NOTICE file
distributed with this work for additional information regarding copyright ownership.
The ASF licenses this file to you under the Apache License, Version 2.0 (the
"License"); you may not use this file except in compliance with the License. You may
obtain a copy of the License at http://www.apache.org/licenses/LICENSE-2.0. Unless
required by applicable law or agreed to in writing, software distributed under the
License is distributed on an "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY
KIND, either express or implied. See the License for the specific language governing
permissions and limitations under the License.
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
                raise GenerationError(f"{where}: an added member must follow a replaced one in targets.MEMBERS")
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


def _description(spec: PatchSpec) -> list[str]:
    fix_file = "src/airflow_dataset_race_fix/fix/" + target_path(spec.module).removeprefix("airflow/")
    paragraphs = [p for p in textwrap.dedent(spec.body).strip().split("\n\n")]
    paragraphs.append("Design references, upstream: " + "; ".join(REFERENCES) + ".")
    paragraphs.append(
        f"Generated by 'airflow-dataset-race-fix generate-patches' from {fix_file}, the fixed "
        "code that the import-time shim also installs. Do not edit by hand: change the fix and "
        "regenerate. The text does not name the release, so that releases whose diff is the same "
        "get the same file."
    )
    paragraphs.append(LICENSE_NOTICE.strip())
    lines = [f"Description: {spec.subject}"]
    for number, paragraph in enumerate(paragraphs):
        if number:
            lines.append(" .")
        rows = textwrap.wrap(" ".join(paragraph.split()), width=84, break_on_hyphens=False, break_long_words=False)
        lines.extend(" " + row for row in rows)
    return lines


def render_patch(spec: PatchSpec, version: str, pristine: str, last_update: str) -> str:
    header = [
        *_description(spec),
        "Author: airflow-dataset-race-fix contributors",
        "Origin: vendor, airflow-dataset-race-fix (generated from its fix module)",
        *(f"Bug: {url}" for url in BUGS),
        "Forwarded: no",
        f"Last-Update: {last_update}",
        "---",
        "",
    ]
    diff = unified_diff(spec.path, pristine, patched_source(spec.module, pristine, version))
    return "\n".join(header) + "\n" + diff


def render_series(version: str) -> str:
    names = "".join(f"{spec.filename}\n" for spec in PATCHES)
    return (
        f"# apache-airflow {version}: apply in this order, e.g. with\n"
        "#   airflow-dataset-race-fix apply   (checks, backups, atomic replace)\n"
        "# or, one file after the other,\n"
        "#   patch -p1 -d <site-packages> < <file>\n" + names
    )


def read_series(text: str) -> list[str]:
    """Patch file names in a quilt ``series`` (comments and options ignored)."""
    names = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line.split()[0])
    return names


def render_version(version: str, pristine: dict[str, bytes], existing: Path | None = None) -> dict[str, str]:
    """File name -> text of ``patches/<version>/``.

    Last-Update stays as committed while a patch's text is otherwise unchanged, so the
    output is reproducible; a patch that changes gets today's date.
    """
    files = {"series": render_series(version)}
    today = datetime.date.today().isoformat()
    for spec in PATCHES:
        text = pristine[spec.path].decode("utf-8")
        old = existing / spec.filename if existing else None
        old_text = old.read_text(encoding="utf-8") if old and old.is_file() else ""
        match = _LAST_UPDATE.search(old_text)
        if match:
            candidate = render_patch(spec, version, text, match.group(1))
            if candidate == old_text:
                files[spec.filename] = candidate
                continue
        files[spec.filename] = render_patch(spec, version, text, today)
    return files


def target_paths() -> list[str]:
    return [target_path(module) for module in TARGET_MODULES]


def differences(patches_dir: Path, generated: dict[str, dict[str, str]]) -> list[str]:
    """What in ``patches_dir`` differs from ``generated`` (version -> files); empty if none."""
    problems = []
    for version, files in generated.items():
        for name, text in files.items():
            path = patches_dir / version / name
            if not path.is_file():
                problems.append(f"{path}: missing")
            elif path.read_text(encoding="utf-8") != text:
                problems.append(f"{path}: differs from the generated patch")
        directory = patches_dir / version
        if directory.is_dir():
            problems.extend(f"{extra}: not generated" for extra in sorted(directory.iterdir()) if extra.name not in files)
    if patches_dir.is_dir():
        problems.extend(
            f"{d}: not a supported version"
            for d in sorted(patches_dir.iterdir())
            if d.is_dir() and d.name not in SUPPORTED_AIRFLOW_VERSIONS
        )
    return problems


def write_version(patches_dir: Path, version: str, files: dict[str, str]) -> list[Path]:
    """Write the files that changed; returns them."""
    directory = patches_dir / version
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written
