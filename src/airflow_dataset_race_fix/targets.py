"""
What the fix replaces, as data: the one list that the shim, the source patches and
``status`` all read. Importing this module imports nothing from Airflow.

Each :class:`Member` is one attribute of an Airflow class. ``original_sha256`` is the
fingerprint of the pristine member's source (``None`` when the fix adds the member);
the fixed source lives in ``airflow_dataset_race_fix.fix.<path under airflow>`` as a
member of a mirror class with the same name.
"""

from __future__ import annotations

import hashlib
import inspect
import textwrap
from collections import namedtuple

# Releases whose targeted members are byte-identical to the fingerprints below, checked
# against each release's wheel by tests/test_source_patches.py (all nine: one fingerprint
# per member is enough). The target files themselves differ between releases, away from
# the members (2.10.0-2.10.2's manager.py priority-parsing helpers; the scheduler file in
# five variants), which only moves the hunks: patches/ has one series, applied at an offset,
# with each release's sha256s in patches/verified-releases.
SUPPORTED_AIRFLOW_VERSIONS = (
    "2.10.0",
    "2.10.1",
    "2.10.2",
    "2.10.3",
    "2.10.4",
    "2.10.5",
    "2.11.0",
    "2.11.1",
    "2.11.2",
)


def release_of(version: str | None) -> str | None:
    """The supported release ``version`` is, or is a local build of (``2.10.5+astro.3``: 2.10.5); else None.
    A local build is judged by its targeted members, like the release: byte-identical ones are patched."""
    release = (version or "").partition("+")[0]
    return release if release in SUPPORTED_AIRFLOW_VERSIONS else None


# The fixed producer upserts with ON CONFLICT DO UPDATE, which SQLite has since 3.24.0
# (Airflow 2.10 itself accepts 3.15.0). On an older library every producer would fail.
MIN_SQLITE_VERSION = (3, 24, 0)


def environment_problem(sql_alchemy_conn: str | None) -> str | None:
    """Why the fixed SQL cannot run against this metadata database here, or None."""
    import sqlite3

    if (sql_alchemy_conn or "").startswith("sqlite") and sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
        return (
            f"the metadata database is SQLite and this Python's SQLite library is {sqlite3.sqlite_version}, "
            f"which has no upsert (ON CONFLICT DO UPDATE needs {'.'.join(map(str, MIN_SQLITE_VERSION))} or "
            "newer); nothing was patched: use a Python built with a newer SQLite, or PostgreSQL/MySQL"
        )
    return None


class Member(namedtuple("Member", "module owner name original_sha256")):  # cheaper to define than a dataclass
    __slots__ = ()

    @property
    def fix_module(self) -> str:
        return "airflow_dataset_race_fix.fix." + self.module.removeprefix("airflow.")

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.owner}.{self.name}"


_MANAGER = ("airflow.datasets.manager", "DatasetManager")
SCHEDULER_MODULE = "airflow.jobs.scheduler_job_runner"
_SCHEDULER = (SCHEDULER_MODULE, "SchedulerJobRunner")
# Fingerprints of the pristine members the fix replaces; every other member is one the fix adds.
_ORIGINAL_SHA256 = {
    "register_dataset_change": "002d718a4a06b2ad7957c1cba24b72330cbad78d07f128feb5e542586f83b770",
    "_slow_path_queue_dagruns": "662cf9d25910de89a8da74ed2285e170eec7586234e0451c25bb8637f37a106a",
    "_postgres_queue_dagruns": "8d5f0ab805811c8a4f8ab4fc4b089a7ef9b60e127d41cde823dc486a525a784e",
    "_create_dagruns_for_dags": "0fba323d00304d90e3fdce7cb5efbd3818bc094c1a2ae4b0fb3a9243bf880881",
    "_create_dag_runs_dataset_triggered": "ec956aa0e0cf165798c17c1e9c1db02142430e8f90f9955cef46b9efc0cce846",
}
# Each owner's members, in the order of the fix's source (and of the patches' hunks).
_MEMBER_NAMES = {
    _MANAGER: """
    register_dataset_change _slow_path_queue_dagruns _postgres_queue_dagruns _defer_queue_dagruns
    _stamp_at_commit _listen_for_commit _write_at_commit _forget_rolled_back_queue_rows
    _forget_ended_queue_rows _database_clock _database_now _send _stamp_events_and_date_queue_rows
    _take_queue_rows _queue_keys_joined_first _postgres_upsert_queue_rows _row_in_list
    _upsert_queue_rows_taken_first _sqlite_upsert_queue_rows _dataset_race_fix_settings
    _dataset_race_fix_setting
    """,
    _SCHEDULER: """
    _create_dagruns_for_dags _dataset_manager _DatasetFloors _DatasetEventRead _DatasetRunChoice
    _DatasetDecisionState _DatasetDecision _DatasetCheckedRead _DatasetSweep _DatasetNet
    _dags_with_unqueued_dataset_events _start_sweep_round _dags_with_new_unqueued_events _sweep_statement
    _runnable_dataset_dags _dags_with_stranded_dataset_events _dataset_findings _dags_ready_by_findings
    _follow_dataset_event_ids _both_ends _dataset_consumers _dataset_follow_mark _latest_dataset_run_date
    _decide_dataset_triggered_runs _dataset_statement _read_dataset_decision_state
    _runs_and_datasets_statement _events_not_consumed_statement _dataset_floors _remember_dataset_reads
    _checked_dataset_floors _choose_dataset_run _events_for_timetable _dataset_events_by_id
    _create_dag_runs_dataset_triggered _link_consumed_events _delete_dataset_queue_rows_as_read
    """,
}
MEMBERS = tuple(
    Member(*owner, name, _ORIGINAL_SHA256.get(name))
    for owner, names in _MEMBER_NAMES.items()
    for name in names.split()
)

TARGET_MODULES = tuple(dict.fromkeys(m.module for m in MEMBERS))


def members_of(module: str) -> tuple[Member, ...]:
    return tuple(m for m in MEMBERS if m.module == module)


def member_source(attribute: object) -> str:
    """Dedented source of a class attribute (function, classmethod or staticmethod)."""
    function = getattr(attribute, "__func__", attribute)
    return textwrap.dedent(inspect.getsource(function))


def fingerprint(attribute: object) -> str:
    return hashlib.sha256(member_source(attribute).encode()).hexdigest()
