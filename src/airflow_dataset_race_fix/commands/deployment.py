"""
``airflow-dataset-race-fix deployment``: which schedulers, components and producer hosts ran the
fix over the last hours, and which did not (``diagnostics.deployment``; docs/activation.md,
"Which processes run the fix"). Read-only, as ``audit`` reads. Exit status: 0 every process seen
ran the fix, 1 some did not, 2 bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from datetime import datetime

from airflow_dataset_race_fix.cli import UsageError, print_result
from airflow_dataset_race_fix.diagnostics import database, deployment


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "deployment",
        help="which processes of this deployment ran the fix, from the metadata database (read-only)",
        description="From the marks that processes with this package leave in Airflow's audit log, the job "
        "table and the dataset events' task instances: every scheduler, component and producer host seen "
        "over the last hours, and whether it ran the fix. "
        "Exit status: 0 all did, 1 some did not, 2 bad input.",
    )
    add = parser.add_argument
    add("--hours", default="24", help="the period to look at, above 0 and at most 8784 (default 24)")
    add("--db-url", metavar="URL", help="SQLAlchemy URL (default: Airflow's sql_alchemy_conn)")
    add("--json", action="store_true", help="print one JSON document (docs/deployment-json.md)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        hours = deployment.period_hours(args.hours)
    except ValueError as err:
        raise UsageError(str(err)) from None
    # Airflow may log to stdout; stdout is the result's
    with contextlib.redirect_stdout(sys.stderr), database.reading(args.db_url) as (session, _, _):
        found = deployment.collect(session, hours)
    text = json.dumps(found, indent=2, default=datetime.isoformat) if args.json else deployment.render(found)
    print_result(text)  # with --json each time in ISO 8601: the only values that are not JSON's own
    return 0 if found["all_fixed"] else 1
