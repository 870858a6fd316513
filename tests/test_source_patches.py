"""
The one series on every supported release: generated from the fix (the committed files
must be what tools/patchgen writes), taken by the pristine files of each release's wheel
with our CLI and with plain ``patch -p1`` (at an offset, never with fuzz), compiled, and
reverted to the exact pristine bytes. No Airflow install is touched: each test patches a
throw-away site-packages.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import AIRFLOW_VERSION
from matrix import ON_MAIN_RELEASE_ONLY, ON_SQLITE_ONLY
from source_patch_support import PATCHES_DIR, release, site_packages, snapshot

from airflow_dataset_race_fix.cli import main
from airflow_dataset_race_fix.source_patches import applier, members
from airflow_dataset_race_fix.source_patches.record import record_digest, record_to_hex
from airflow_dataset_race_fix.source_patches.safe_write import TEMP_SUFFIX
from airflow_dataset_race_fix.source_patches.series import SERIES, VERIFIED, read_series, read_verified
from airflow_dataset_race_fix.targets import MEMBERS, SUPPORTED_AIRFLOW_VERSIONS, members_of
from tools.patchgen import generator

# the nine releases' files, whichever Airflow is installed: once per Python
pytestmark = [ON_SQLITE_ONLY, ON_MAIN_RELEASE_ONLY]

VERSIONS = SUPPORTED_AIRFLOW_VERSIONS
PATCH = shutil.which("patch")
BACKUPS = applier.BACKUP_DIR


def cli(capsys, command: str, sp, *extra, patches_dir=PATCHES_DIR) -> tuple[int, str, str]:
    rc = main([command, "--site-packages", str(sp), "--patches-dir", str(patches_dir), *extra])
    out, err = capsys.readouterr()
    return rc, out, err


def sources(snap: dict[str, bytes]) -> dict[str, bytes]:
    """A snapshot without bytecode caches."""
    return {path: data for path, data in snap.items() if "__pycache__" not in path}


def series() -> list[str]:
    return read_series((PATCHES_DIR / SERIES).read_text())


def assert_patched(sp, version: str) -> None:
    for spec in generator.PATCHES:
        pristine = release(version).files[spec.path].decode()
        text = (sp / spec.path).read_text()
        assert text == generator.patched_source(spec.module, pristine, version)
        compile(text, spec.path, "exec")
        # What the shim's "source-patched" check compares: the member as inspect.getsource sees it.
        lines = text.splitlines(keepends=True)
        for member in members_of(spec.module):
            assert members.member_lines(lines, member.owner, member.name) == members.fixed_member_lines(
                member
            )


# -- generated, one source of truth -------------------------------------------------------


def test_committed_patches_are_what_the_generator_writes():
    """One series, made from the fix and verified against all nine releases' files."""
    generated = generator.render({version: release(version).files for version in VERSIONS}, PATCHES_DIR)
    problems = generator.differences(PATCHES_DIR, generated)
    assert not problems, "run 'python -m tools.patchgen': " + "; ".join(problems)


def test_patches_exist_for_exactly_the_supported_versions():
    assert sorted(read_verified(PATCHES_DIR / VERIFIED)) == sorted(VERSIONS)


@pytest.mark.parametrize("version", VERSIONS)
def test_targeted_members_are_the_fingerprinted_originals(version):
    for member in MEMBERS:
        lines = (
            release(version).files[generator.target_path(member.module)].decode().splitlines(keepends=True)
        )
        span = members.member_span(lines, member.owner, member.name)
        if member.original_sha256 is None:
            assert span is None, f"{member.qualname} already exists in {version}"
        else:
            assert members.dedented_sha256(lines[span[0] : span[1]]) == member.original_sha256, (
                member.qualname
            )


def test_patch_headers_are_dep3_with_the_license_notice():
    for path in sorted(PATCHES_DIR.glob("*.patch")):
        header = path.read_text().split("\n---\n", 1)[0]
        fields = {line.split(":", 1)[0] for line in header.splitlines() if line and not line.startswith(" ")}
        assert {"Description", "Origin", "Bug", "Forwarded", "Last-Update"} <= fields, path
        assert "Apache License, Version 2.0" in header and "Apache Software" in header, path
        assert "https://github.com/apache/airflow/issues/56541" in header, path


# -- every supported release, our CLI and plain patch -----------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_cli_applies_and_reverts(version, tmp_path, capsys):
    sp = site_packages(version, tmp_path)
    pristine = snapshot(sp)

    rc, out, err = cli(capsys, "apply", sp, "--dry-run")
    assert rc == 0 and out.startswith("dry run"), err
    assert snapshot(sp) == pristine

    rc, out, err = cli(capsys, "apply", sp)
    assert rc == 0, err
    assert_patched(sp, version)
    for spec in generator.PATCHES:  # fresh bytecode next to each touched file
        assert list((sp / spec.path).parent.glob("__pycache__/*.pyc")), spec.path

    rc, out, err = cli(capsys, "apply", sp)
    assert rc == 0 and out.startswith("already applied"), (out, err)
    assert cli(capsys, "check", sp)[0] == 0

    rc, out, err = cli(capsys, "revert", sp)
    assert rc == 0, err
    assert sources(snapshot(sp)) == pristine
    assert not (sp / BACKUPS).exists()
    rc, out, err = cli(capsys, "revert", sp)
    assert rc == 0 and out.startswith("not applied"), (out, err)
    assert cli(capsys, "check", sp)[0] == 1


def run_patch(sp, patch_file, *options: str) -> str:
    result = subprocess.run(
        [
            PATCH,
            "-p1",
            "--forward",
            "--no-backup-if-mismatch",
            "-d",
            str(sp),
            "-i",
            str(patch_file),
            *options,
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # one series for all releases: their hunks at an offset, but every line as the patch says
    assert "fuzz" not in result.stdout, result.stdout
    return result.stdout


@pytest.mark.skipif(PATCH is None, reason="the 'patch' tool is not installed (apt-get install patch)")
@pytest.mark.parametrize("version", VERSIONS)
def test_plain_patch_takes_the_series_one_file_at_a_time(version, tmp_path, capsys):
    sp = site_packages(version, tmp_path)
    pristine = snapshot(sp)
    for name in series():
        run_patch(sp, PATCHES_DIR / name, "--dry-run")
        run_patch(sp, PATCHES_DIR / name)
    assert_patched(sp, version)
    assert cli(capsys, "check", sp)[0] == 0  # our CLI knows a tree patched without it

    for name in reversed(series()):
        run_patch(sp, PATCHES_DIR / name, "--reverse")
    assert snapshot(sp) == pristine

    for name in series():
        run_patch(sp, PATCHES_DIR / name)
    rc, _, err = cli(capsys, "revert", sp)  # no backups here: revert by the patches, checked by RECORD
    assert rc == 0, err
    assert sources(snapshot(sp)) == pristine


# -- bad input: refused clearly, nothing lost ---------------------------------------------------

VERSION = AIRFLOW_VERSION  # the release installed here (tox: one env per release)
SCHEDULER = "airflow/jobs/scheduler_job_runner.py"
MANAGER = "airflow/datasets/manager.py"


def test_modified_target_is_refused(tmp_path, capsys):
    sp = site_packages(VERSION, tmp_path)
    (sp / SCHEDULER).write_bytes((sp / SCHEDULER).read_bytes() + b"# a local change\n")
    before = snapshot(sp)
    for command in ("apply", "revert", "check"):
        rc, _, err = cli(capsys, command, sp)
        assert rc == 1, command
        assert snapshot(sp) == before, command
    rc, _, err = cli(capsys, "apply", sp)
    expected = record_to_hex(record_digest(release(VERSION).files[SCHEDULER]))
    found = record_to_hex(record_digest(before[SCHEDULER]))
    assert SCHEDULER in err and expected in err and found in err, err
    assert f"pip install --force-reinstall --no-deps apache-airflow=={VERSION}" in err
    assert not (sp / BACKUPS).exists()


def test_hand_edit_after_apply_is_kept(tmp_path, capsys):
    sp = site_packages(VERSION, tmp_path)
    assert cli(capsys, "apply", sp)[0] == 0
    (sp / MANAGER).write_text(
        (sp / MANAGER).read_text().replace("# MySQL and SQLite", "# edited: MySQL and SQLite")
    )
    before = snapshot(sp)
    rc, _, err = cli(capsys, "revert", sp)
    assert rc == 1 and MANAGER in err
    assert snapshot(sp) == before  # the edit and the backups are still there


def test_unsupported_version_is_refused(tmp_path, capsys):
    sp = site_packages(VERSION, tmp_path)
    dist_info = sp / f"apache_airflow-{VERSION}.dist-info"
    metadata = dist_info / "METADATA"
    metadata.write_text(metadata.read_text().replace(f"Version: {VERSION}", "Version: 2.9.3", 1))
    dist_info.rename(sp / "apache_airflow-2.9.3.dist-info")
    before = snapshot(sp)
    rc, _, err = cli(capsys, "apply", sp)
    assert rc == 1 and "apache-airflow 2.9.3" in err and "not supported" in err, err
    assert snapshot(sp) == before


def _make_local_build(sp: Path, label: str = "+astro.1") -> None:
    """The wheel rebuilt with a local version label, as Astronomer and Cloud Composer ship Airflow."""
    dist_info = sp / f"apache_airflow-{VERSION}.dist-info"
    metadata = dist_info / "METADATA"
    metadata.write_text(metadata.read_text().replace(f"Version: {VERSION}", f"Version: {VERSION}{label}", 1))
    dist_info.rename(sp / f"apache_airflow-{VERSION}{label}.dist-info")


def test_a_local_build_with_the_release_s_files_is_patched_and_reverted(tmp_path, capsys):
    sp = site_packages(VERSION, tmp_path)
    _make_local_build(sp)
    before = snapshot(sp)
    rc, out, err = cli(capsys, "apply", sp)
    assert rc == 0 and "applied" in out, err
    assert cli(capsys, "revert", sp)[0] == 0
    after = {p: b for p, b in snapshot(sp).items() if BACKUPS not in p and "__pycache__" not in p}
    assert after == before


def test_a_local_build_that_changed_a_target_is_refused_and_says_what_still_works(tmp_path, capsys):
    from airflow_dataset_race_fix.source_patches.record import record_digest

    sp = site_packages(VERSION, tmp_path)
    _make_local_build(sp, "+composer")
    changed = (sp / MANAGER).read_bytes() + b"\n# the platform's own change\n"
    (sp / MANAGER).write_bytes(changed)
    record = next(sp.glob("apache_airflow-*.dist-info")) / "RECORD"  # a consistent build: its RECORD has it
    record.write_text(
        "\n".join(
            f"{MANAGER},{record_digest(changed)},{len(changed)}" if line.startswith(MANAGER + ",") else line
            for line in record.read_text().splitlines()
        )
        + "\n"
    )
    before = snapshot(sp)
    rc, _, err = cli(capsys, "apply", sp)
    assert rc == 1 and MANAGER in err and "this local build of" in err and "audit, explain" in err, err
    assert snapshot(sp) == before


def test_files_of_another_release_are_refused(tmp_path, capsys):
    sp = site_packages(VERSION, tmp_path)
    (sp / SCHEDULER).write_bytes(
        release("2.10.0").files[SCHEDULER]
    )  # 2.10.0's file under this release's RECORD
    before = snapshot(sp)
    rc, _, err = cli(capsys, "apply", sp)
    assert rc == 1 and SCHEDULER in err and f"neither the pristine apache-airflow {VERSION}" in err, err
    assert snapshot(sp) == before


@pytest.mark.skipif(PATCH is None, reason="the 'patch' tool is not installed")
def test_half_applied_series_is_refused_and_revert_recovers(tmp_path, capsys):
    sp = site_packages(VERSION, tmp_path)
    pristine = snapshot(sp)
    run_patch(sp, PATCHES_DIR / series()[0])
    before = snapshot(sp)
    rc, out, err = cli(capsys, "apply", sp)
    assert rc == 1 and "half applied" in err and "revert" in err, err
    assert snapshot(sp) == before
    rc, out, err = cli(capsys, "check", sp)
    assert rc == 1 and "half applied" in out
    assert cli(capsys, "revert", sp)[0] == 0
    assert sources(snapshot(sp)) == pristine
    assert cli(capsys, "apply", sp)[0] == 0


def test_half_applied_patch_is_refused(tmp_path, capsys):
    """Only the first hunk of 0002 applied (what a failed hand-run 'patch' can leave)."""
    sp = site_packages(VERSION, tmp_path)
    from airflow_dataset_race_fix.source_patches import unidiff

    _, (file_patch,) = unidiff.parse((PATCHES_DIR / series()[1]).read_text())
    file_patch.hunks = file_patch.hunks[:1]
    (sp / SCHEDULER).write_text(unidiff.apply(file_patch, (sp / SCHEDULER).read_text()))
    before = snapshot(sp)
    rc, _, err = cli(capsys, "apply", sp)
    assert rc == 1 and SCHEDULER in err and "neither the pristine" in err, err
    assert snapshot(sp) == before


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda t: t.replace("# deleted at the end, as read", "# deleted at the end"),
            "differs from the fix",
        ),
        (
            lambda t: t.replace(
                "\n         self._create_dag_runs(non_dataset_dags",
                "\n         self._create_dag_runs2(non_dataset_dags",
                1,
            ),
            "does not fit",
        ),
        (
            lambda t: t.replace(
                '+                Stats.incr("dataset_race_fix.empty_runs_prevented")\n', "", 1
            ),
            "cannot be read as a patch",
        ),
    ],
    ids=["added-line", "context-line", "line-counts"],
)
def test_hand_edited_patch_file_is_refused(edit, message, tmp_path, capsys):
    patches = tmp_path / "patches"
    shutil.copytree(PATCHES_DIR, patches)
    edited = patches / series()[1]
    text = edited.read_text()
    assert edit(text) != text
    edited.write_text(edit(text))
    sp = site_packages(VERSION, tmp_path)
    before = snapshot(sp)
    rc, _, err = cli(capsys, "apply", sp, patches_dir=patches)
    assert rc == 1 and message in err and str(edited) in err, err
    assert snapshot(sp) == before


def test_read_only_site_packages_is_refused(tmp_path):
    sp = site_packages(VERSION, tmp_path)
    before = snapshot(sp)
    command = [
        sys.executable,
        "-m",
        "airflow_dataset_race_fix",
        "apply",
        "--site-packages",
        str(sp),
        "--patches-dir",
        str(PATCHES_DIR),
    ]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: cannot take away root's write access")
        command = [setpriv, "--bounding-set=-dac_override,-fowner", *command]
    read_only = sp / "airflow" / "jobs"  # the second target only: the first must stay untouched too
    read_only.chmod(0o555)
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    finally:
        read_only.chmod(0o755)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"cannot write to {read_only}" in result.stderr and "read-only" in result.stderr, result.stderr
    assert snapshot(sp) == before
    assert not (sp / BACKUPS).exists()


@pytest.mark.parametrize("where", [BACKUPS, "."], ids=["writing-backups", "swapping-targets"])
def test_interrupted_apply_leaves_everything_pristine(where, tmp_path, capsys, monkeypatch):
    sp = site_packages(VERSION, tmp_path)
    pristine = snapshot(sp)
    real_replace = os.replace
    interrupts = [KeyboardInterrupt]

    def interrupted(src, dst):
        # Ctrl-C as the second file is written (for targets: after manager.py was swapped in),
        # once: putting the files back renames over the same path again.
        if str(dst) == str((sp / where / SCHEDULER).resolve()) and interrupts:
            raise interrupts.pop()
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", interrupted)
    rc, _, err = cli(capsys, "apply", sp)
    monkeypatch.undo()
    assert rc == 130
    after = sources(snapshot(sp))
    assert {p: after[p] for p in pristine} == pristine  # targets pristine again
    assert not [p for p in after if p.endswith(TEMP_SUFFIX)]  # no temporary file left
    assert cli(capsys, "apply", sp)[0] == 0
    assert_patched(sp, VERSION)


def test_patches_of_another_version_of_the_fix_are_updated_or_reverted(tmp_path, capsys, monkeypatch):
    """After upgrading this package: the old patched files are known by the backups' manifest."""
    sp = site_packages(VERSION, tmp_path)
    pristine = snapshot(sp)
    assert cli(capsys, "apply", sp)[0] == 0
    old_patched = snapshot(sp)
    real = generator.patched_source
    monkeypatch.setattr(generator, "patched_source", lambda *a: real(*a) + "# fix v2\n")
    patches = tmp_path / "patches"
    generator.write(patches, generator.render({VERSION: release(VERSION).files}))

    rc, out, err = cli(capsys, "check", sp, patches_dir=patches)
    assert rc == 1 and "another version" in out, out + err
    rc, out, err = cli(capsys, "revert", sp, patches_dir=patches)  # the pristine files, from the backups
    assert rc == 0, err
    assert sources(snapshot(sp)) == pristine

    monkeypatch.undo()
    assert cli(capsys, "apply", sp)[0] == 0
    monkeypatch.setattr(generator, "patched_source", lambda *a: real(*a) + "# fix v2\n")
    rc, out, err = cli(capsys, "apply", sp, patches_dir=patches)
    assert rc == 0 and out.startswith("updated"), out + err
    assert all((sp / p).read_text().endswith("# fix v2\n") for p in (MANAGER, SCHEDULER))
    assert sources(snapshot(sp)) != sources(old_patched)
    rc, out, err = cli(capsys, "revert", sp, patches_dir=patches)
    assert rc == 0 and sources(snapshot(sp)) == pristine, err


def test_series_missing_a_patch_is_refused(tmp_path, capsys):
    patches = tmp_path / "patches"
    shutil.copytree(PATCHES_DIR, patches)
    (patches / SERIES).write_text(series()[0] + "\n")
    sp = site_packages(VERSION, tmp_path)
    before = snapshot(sp)
    rc, _, err = cli(capsys, "apply", sp, patches_dir=patches)
    assert rc == 1 and SCHEDULER in err and "restore patches/" in err, err
    assert snapshot(sp) == before


def test_patches_dir_of_the_old_per_release_layout_is_refused(tmp_path, capsys):
    patches = tmp_path / "patches"
    shutil.copytree(PATCHES_DIR, patches / VERSION)
    sp = site_packages(VERSION, tmp_path)
    before = snapshot(sp)
    rc, _, err = cli(capsys, "apply", sp, patches_dir=patches)
    assert rc == 1 and "one series per release" in err and VERIFIED in err, err
    assert snapshot(sp) == before


def test_release_whose_record_is_not_the_verified_one_is_refused(tmp_path, capsys):
    """A RECORD that names other pristine bytes than verified-releases (a rebuilt wheel)."""
    patches = tmp_path / "patches"
    shutil.copytree(PATCHES_DIR, patches)
    record = patches / VERIFIED
    pristine = record_to_hex(record_digest(release(VERSION).files[SCHEDULER]))
    row = f"{VERSION}\t{SCHEDULER}\t"
    record.write_text(record.read_text().replace(row + pristine, row + "0" * 64))
    sp = site_packages(VERSION, tmp_path)
    before = snapshot(sp)
    rc, _, err = cli(capsys, "apply", sp, patches_dir=patches)
    assert rc == 1 and "not the file the series was verified against" in err and pristine in err, err
    assert snapshot(sp) == before


def test_hunks_are_found_at_an_offset_never_with_fuzz():
    from airflow_dataset_race_fix.source_patches import unidiff

    _, (file_patch,) = unidiff.parse("--- a/f.py\n+++ b/f.py\n@@ -2,3 +2,3 @@\n a\n-b\n+B\n c\n")
    text = "x\ny\na\nb\nc\na\nb\nc\n"  # two places: the nearest to line 2 wins, as GNU patch picks it
    assert unidiff.apply(file_patch, text) == "x\ny\na\nB\nc\na\nb\nc\n"
    assert unidiff.apply(file_patch, unidiff.apply(file_patch, text), reverse=True) == text
    with pytest.raises(unidiff.PatchError):
        unidiff.apply(file_patch, "a\nb2\nc\n")


def test_apply_refuses_a_sqlite_database_whose_library_has_no_upsert(tmp_path, capsys, monkeypatch):
    import sqlite3

    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{tmp_path}/airflow.db")
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 22, 0))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.22.0")
    sp = site_packages(VERSION, tmp_path)
    before = snapshot(sp)
    rc, _, err = cli(capsys, "apply", sp)
    assert rc == 1 and "SQLite library is 3.22.0, which has no upsert" in err, err
    assert snapshot(sp) == before


# -- SIGKILL and concurrency: no half state runs, commands take turns -----------------------

TARGET_PATHS = (MANAGER, SCHEDULER)
# The applier without the CLI (which imports Airflow's configuration: seconds per child).
APPLIER_CHILD = """
import sys
from pathlib import Path
from airflow_dataset_race_fix.source_patches import applier
print(getattr(applier, sys.argv[1])(Path(sys.argv[2]), Path(sys.argv[3])).message)
"""
# What an Airflow process would import from a site-packages (without the shim).
IMPORT_CHILD = """
import json
from airflow_dataset_race_fix import runtime
states = {}
for name in ("airflow.datasets.manager", "airflow.jobs.scheduler_job_runner"):
    try:
        __import__(name)
        states[name] = runtime.module_state(name).state
    except ModuleNotFoundError:
        states[name] = "absent"
print("RESULT " + json.dumps(states))
"""


def _on_disk(sp, pristine: dict[str, bytes], patched: dict[str, bytes]) -> tuple[str, ...]:
    def state(path):
        if not (sp / path).exists():
            return "absent"
        data = (sp / path).read_bytes()
        return "pristine" if data == pristine[path] else "patched" if data == patched[path] else "other"

    return tuple(state(path) for path in TARGET_PATHS)


def test_sigkill_at_any_step_of_apply_or_revert_never_leaves_a_half_state_that_runs(tmp_path, capsys):
    import random

    from shim_children import airflow_shadow, child_env, output, result, run_python, run_status

    sp = Path(airflow_shadow(str(tmp_path / "site")))
    pristine = {p: (sp / p).read_bytes() for p in TARGET_PATHS}
    applier.apply(sp, PATCHES_DIR)
    patched = {p: (sp / p).read_bytes() for p in TARGET_PATHS}
    applier.revert(sp, PATCHES_DIR)
    start = {"apply": ("pristine", "pristine"), "revert": ("patched", "patched")}
    imported: dict[tuple[str, ...], dict] = {}
    rng = random.Random(24)

    def interrupted(operation: str, kill: str | None, delay: float) -> tuple[str, ...] | None:
        """Run ``operation`` in a child killed at step ``kill`` (or after ``delay``); the state it leaves."""
        env = child_env(ADRF_TEST_STEP=kill) if kill else child_env()
        child = subprocess.Popen(
            [sys.executable, "-c", APPLIER_CHILD, operation, str(sp), str(PATCHES_DIR)], env=env
        )
        if not kill:
            try:
                child.wait(delay)
            except subprocess.TimeoutExpired:
                child.kill()
        if child.wait(60) == 0:
            return None  # it finished before the kill
        assert child.returncode == -signal.SIGKILL
        return _on_disk(sp, pristine, patched)

    for operation, undo in (("apply", "revert"), ("revert", "apply")):
        kills = [(f"kill:{n}", 0.0) for n in range(1, 30)] + [(None, rng.uniform(0.2, 0.6)) for _ in range(2)]
        for i, (kill, delay) in enumerate(kills):
            if _on_disk(sp, pristine, patched) != start[operation]:
                getattr(applier, undo)(sp, PATCHES_DIR)
            left = interrupted(operation, kill, delay)
            if left is None:
                if kill:
                    kills[i + 1 :] = [k for k in kills[i + 1 :] if k[0] is None]  # every step was tried
                continue
            # Never a fixed file beside a stock one: while they disagree, the scheduler is absent.
            whole = (
                ("pristine", "pristine"),
                ("patched", "patched"),
                ("pristine", "absent"),
                ("patched", "absent"),
            )
            assert left in whole, (operation, kill, left)
            inspection = applier.check(sp, PATCHES_DIR)
            if "absent" in left:
                assert inspection.summary.startswith("interrupted"), inspection.summary
            if left not in imported:  # what a process started now would run
                imported[left] = result(run_python(IMPORT_CHILD, child_env([str(sp)])))
                assert len(set(imported[left].values()) - {"absent"}) == 1, (left, imported[left])
                if inspection.interrupted is not None:
                    rc, out, _ = cli(capsys, "check", sp)
                    assert rc == 1 and "interrupted" in out, out
                if left == ("patched", "absent"):
                    status = run_status(child_env([str(sp)]))
                    assert status.returncode == 1 and "did not finish (killed?)" in status.stdout, output(
                        status
                    )
            # The next command finishes the interrupted one, or undoes it (every other time).
            recovery, end = (operation, start[undo]) if i % 2 else (undo, start[operation])
            rc, out, err = cli(capsys, recovery, sp)
            assert rc == 0, err
            assert _on_disk(sp, pristine, patched) == end
            assert not (sp / BACKUPS / applier.JOURNAL).exists()
            assert not [p for p in sources(snapshot(sp)) if p.endswith(TEMP_SUFFIX)]
    assert ("patched", "absent") in imported and ("pristine", "absent") in imported  # the swap was hit


def _apply_child(sp, *env: tuple[str, str]) -> subprocess.Popen:
    from shim_children import child_env

    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "airflow_dataset_race_fix",
            "apply",
            "--site-packages",
            str(sp),
            "--patches-dir",
            str(PATCHES_DIR),
        ],
        env=child_env(**dict(env)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_a_second_apply_waits_for_the_first_then_says_already_applied(tmp_path):
    sp = site_packages(VERSION, tmp_path)
    first = _apply_child(sp, ("ADRF_TEST_STEP", "stop:3"))  # stopped with the journal written
    deadline = time.monotonic() + 60
    while not _stopped(first.pid):
        assert first.poll() is None and time.monotonic() < deadline, "the first apply never reached its swap"
        time.sleep(0.05)
    second = _apply_child(sp)
    ready, _, _ = select.select([second.stderr], [], [], 60)  # its first line: it has to wait
    waiting = second.stderr.readline() if ready else ""
    assert "waiting for another apply or revert" in waiting, waiting
    assert second.poll() is None
    os.kill(first.pid, signal.SIGCONT)
    out1, err1 = first.communicate(timeout=60)
    out2, err2 = second.communicate(timeout=60)
    assert first.returncode == 0 and out1.startswith("applied"), out1 + err1
    assert second.returncode == 0 and out2.startswith("already applied"), out2 + err2
    assert "Traceback" not in err2
    assert_patched(sp, VERSION)

    for _ in range(3):  # free-running pairs, as two deploy jobs would start them
        for command in ("revert", "apply"):
            pair = [
                subprocess.Popen(
                    [sys.executable, "-c", APPLIER_CHILD, command, str(sp), str(PATCHES_DIR)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for _ in range(2)
            ]
            outputs = [child.communicate(timeout=60) for child in pair]
            assert [child.returncode for child in pair] == [0, 0], outputs
            assert not any("Traceback" in err or "half applied" in err for _, err in outputs), outputs
            done = "already applied" if command == "apply" else "not applied"
            assert sorted(out.startswith(done) for out, _ in outputs) == [False, True], outputs
    assert_patched(sp, VERSION)
