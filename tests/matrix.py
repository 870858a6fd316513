"""
Where each test module runs in the tox matrix: one place for what used to be a skip per file.

A test runs in every env whose factors can change its outcome, and in no other, so that CI
stays well inside its 90 minutes (a full 3.11 env took 14-16 min before this placement):

- the pure steps (tests/test_decision_steps.py: no database, milliseconds): every env;
- the SQL (scenarios, lock discipline, liveness, stamps, audit, explain, faults): every
  backend, every Airflow release. Nothing here restricts it;
- the process, the files and the command line (the shim's start-up and import hooks, real
  Airflow processes started with it, the CLI's argument and signal handling, the bytecode
  of the fix's globals): the SQLite envs only, of every release and every Python. The
  backend is only the database those processes happen to talk to; the SQL they send is
  tested in-process on every backend;
- what no installed release can change (the source patches of all nine releases, read from
  files in the repository; statement sizes, set by the database): the 2.10.4 envs only;
- the web page (a real webserver and Chromium, about a minute and a half): once per
  release and once per server backend, 2.10.4 on SQLite and 2.11.2 on PostgreSQL;
- the seven other supported releases (2.10.0-2.10.3, 2.10.5, 2.11.0, 2.11.1): what their
  code can change, and no more (RELEASE_CHECK_MODULES, place_by_release): the race scenarios
  (with the shim and, in their -source- envs, with the source patches applied to their files),
  the shim in real Airflow processes, its import hooks where the target files differ from
  2.10.4's and 2.11.2's (2.10.0-2.10.3), and install and 'db migrate' from their pins. Their
  SQL is the same members' (byte-identical: targets.py's fingerprints), so the rest of the SQL
  tests run on 2.10.4 and 2.11.2 only;
- the interleaving explorer (tests/test_explorer.py, 2-3 min per env): the 3.11 shim envs of
  2.10.4 on each backend, SQLite for breadth, the servers with a smaller budget (their
  locks); the fix's SQL is the same in both releases' envs, and stock cannot run in the
  source-patched envs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import AIRFLOW_VERSION, BACKEND, SOURCE_MODE

# tox's own Python: the envs without a pyNN factor
MAIN_PYTHON = (3, 11)
# the quick start's release: README's pins and the envs without an airflow2112 factor
MAIN_RELEASE = "2.10.4"

# the releases whose envs run every test placed on them; the others run RELEASE_CHECK_MODULES
FULL_RELEASES = {MAIN_RELEASE, "2.11.2"}
RELEASE_CHECK_MODULES = {
    "test_decision_steps.py",
    "test_scenarios.py",
    "test_shim.py",
    "test_shim_airflow.py",
    "test_install.py",
}


def _target_files_as_in_a_full_release() -> bool:
    """Whether this release's target files are byte-identical to a FULL_RELEASES one's
    (patches/verified-releases: 2.10.5 and 2.11.0 ship 2.10.4's, 2.11.1 ships 2.11.2's)."""
    pristine = {}
    for line in (Path(__file__).parents[1] / "patches" / "verified-releases").read_text().splitlines():
        if line and not line.startswith("#"):
            release, path, sha256 = line.split("\t")[:3]
            pristine.setdefault(release, set()).add((path, sha256))
    return any(pristine.get(AIRFLOW_VERSION) == pristine[release] for release in FULL_RELEASES)


def place_by_release(items):
    """Skip, in the envs of the releases outside FULL_RELEASES, the modules outside RELEASE_CHECK_MODULES,
    and test_shim.py (the import hooks on the target modules, in this interpreter and in plain
    child interpreters) where the target files are a full release's: test_shim_airflow.py runs
    the shim in this release's own Airflow processes there."""
    if AIRFLOW_VERSION in FULL_RELEASES:
        return
    modules = RELEASE_CHECK_MODULES - ({"test_shim.py"} if _target_files_as_in_a_full_release() else set())
    skip = pytest.mark.skip(
        reason=f"Airflow {AIRFLOW_VERSION}: its envs run {', '.join(sorted(modules))} only"
    )
    for item in items:
        if item.path.name not in modules:
            item.add_marker(skip)


ON_FULL_RELEASES_ONLY = pytest.mark.skipif(
    AIRFLOW_VERSION not in FULL_RELEASES, reason="no release changes it: the 2.10.4 and 2.11.2 envs run it"
)
ON_SQLITE_ONLY = pytest.mark.skipif(
    BACKEND != "sqlite",
    reason="backend-independent (processes, files, command line): the SQLite envs run it",
)
ON_MAIN_RELEASE_ONLY = pytest.mark.skipif(
    AIRFLOW_VERSION != MAIN_RELEASE,
    reason=f"no installed release changes it: the Airflow {MAIN_RELEASE} envs run it",
)
# airflow2104-sqlite and airflow2112-postgres: each release's webserver, SQLite and a server
WEB_PAGE_ENVS = {(MAIN_RELEASE, "sqlite"), ("2.11.2", "postgres")}
ON_WEB_PAGE_ENVS = pytest.mark.skipif(
    SOURCE_MODE or sys.version_info[:2] != MAIN_PYTHON or (AIRFLOW_VERSION, BACKEND) not in WEB_PAGE_ENVS,
    reason="a real webserver and Chromium: airflow2104-sqlite and airflow2112-postgres run it",
)
ON_EXPLORER_ENVS = pytest.mark.skipif(
    SOURCE_MODE or sys.version_info[:2] != MAIN_PYTHON or AIRFLOW_VERSION != MAIN_RELEASE,
    reason="the explorer runs in airflow2104-{sqlite,postgres,mysql} (docs/explorer.md)",
)
