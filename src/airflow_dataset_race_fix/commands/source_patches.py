"""
``apply``, ``revert``, ``check``: the source patches in an installed Airflow. Exit codes: 0 done
(``check``: applied), 1 refused (``check``: not, or not fully, applied), 2 bad usage.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from airflow_dataset_race_fix import cli


def register(subparsers) -> None:
    for name, text in (
        ("apply", "apply the source patches to the installed Airflow (all or nothing)"),
        ("revert", "restore the pristine Airflow files"),
        ("check", "report whether the source patches are applied (exit 0 if they are)"),
    ):
        parser = subparsers.add_parser(name, help=text, description=text)
        if name != "check":
            parser.add_argument("--dry-run", action="store_true", help="check everything, write nothing")
        _add_locations(parser)
        parser.set_defaults(handler=_check if name == "check" else functools.partial(_change, name))


def _add_locations(parser: argparse.ArgumentParser) -> None:
    from airflow_dataset_race_fix.source_patches import locations

    parser.add_argument(
        "--site-packages",
        type=Path,
        help="the site-packages holding Airflow (default: the one this Python imports airflow from)",
    )
    # The default of this installation, not only the rule: from a wheel it is the copy in the
    # package, which no operator would guess from "the source tree's patches/".
    here = locations.default_patches_dir()
    shown = str(here).replace("%", "%%") if here else "none found"
    parser.add_argument(
        "--patches-dir",
        type=Path,
        help="directory with the series, its patch files and "
        "verified-releases (default: $ADRF_PATCHES_DIR, else the patches/ of the source tree this "
        f"package runs from, else the copy a wheel installs in the package; here: {shown})",
    )


def _locations(args) -> tuple[Path, Path]:
    from airflow_dataset_race_fix.source_patches import locations, record

    site_packages = args.site_packages or record.default_site_packages()
    if site_packages is None:
        raise cli.UsageError("Airflow is not importable from this Python; pass --site-packages PATH")
    if not site_packages.is_dir():
        raise cli.UsageError(f"--site-packages {site_packages}: not a directory")
    patches_dir = args.patches_dir or locations.default_patches_dir()
    if patches_dir is None:
        raise cli.UsageError(
            "no patches directory found (this package is not running from its source tree); "
            "pass --patches-dir PATH (the repository's patches/) or set ADRF_PATCHES_DIR"
        )
    if not patches_dir.is_dir():
        raise cli.UsageError(f"--patches-dir {patches_dir}: not a directory")
    return site_packages.resolve(), patches_dir.resolve()


def _waiting(command: str, site_packages: Path):
    message = (
        f"airflow-dataset-race-fix {command}: waiting for another apply or revert in {site_packages} "
        "to finish"
    )
    return functools.partial(print, message, file=sys.stderr, flush=True)


def _refused(command: str, err: Exception) -> int:
    print(f"airflow-dataset-race-fix {command}: refused: {err}", file=sys.stderr)
    return 1


def _configured_database() -> str | None:
    """The metadata database URL of this environment's Airflow configuration, if it can be read."""
    try:
        from airflow.configuration import conf

        return conf.get("database", "sql_alchemy_conn")
    except Exception:
        return None


def _change(command: str, args) -> int:
    """``apply`` or ``revert``: what changed, or why nothing did."""
    from airflow_dataset_race_fix.source_patches import applier
    from airflow_dataset_race_fix.targets import environment_problem

    site_packages, patches_dir = _locations(args)
    if command == "apply" and (problem := environment_problem(_configured_database())):
        return _refused(command, problem)
    try:
        operation = applier.apply if command == "apply" else applier.revert
        outcome = operation(site_packages, patches_dir, args.dry_run, _waiting(command, site_packages))
    except applier.Refused as err:
        return _refused(command, err)
    print(outcome.message)
    for path in outcome.changed:
        print(f"  {path}")
    for warning in outcome.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def _check(args) -> int:
    from airflow_dataset_race_fix.source_patches import applier

    site_packages, patches_dir = _locations(args)
    try:
        inspection = applier.check(site_packages, patches_dir, _waiting("check", site_packages))
    except applier.Refused as err:
        return _refused("check", err)
    print(f"apache-airflow {inspection.version} in {site_packages}: source patches: {inspection.summary}")
    for line in applier.describe(inspection):
        print(f"  {line}")
    return 0 if inspection.summary == "applied" else 1
