"""``reproduce``: prove the bug on stock Airflow and its absence with the fix (see ``airflow_dataset_race_fix.reproduce``)."""

from __future__ import annotations


def register(subparsers) -> None:
    from airflow_dataset_race_fix.reproduce import runner

    parser = subparsers.add_parser(
        "reproduce",
        help="show the races on stock Airflow and show them gone with the fix",
        description="Run the race scenarios (default), a stress run (--stress) or a real scheduler (--e2e) "
        "against stock Airflow and against the fix, each in its own interpreter and scratch database.",
    )
    runner.add_arguments(parser)
    parser.set_defaults(handler=runner.main)
