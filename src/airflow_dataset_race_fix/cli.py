"""
``airflow-dataset-race-fix`` (also ``python -m airflow_dataset_race_fix``).

Each subcommand lives in ``airflow_dataset_race_fix.commands.<name>`` and exposes
``register(subparsers)``; this module only wires them. Importing it imports nothing from
Airflow: subcommands import what they need when they run.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

from airflow_dataset_race_fix import __version__

# Subcommand modules, in the order --help lists them.
COMMAND_MODULES = ("status", "shim", "source_patches", "reproduce", "audit")


class UsageError(Exception):
    """Bad input from the user: printed as one clear line, exit code 2."""


_interrupted = False


def _on_interrupt(signum, frame) -> None:
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


def check_interrupted() -> None:
    """Raise KeyboardInterrupt if Ctrl-C came, even if some library caught the first one.

    Airflow's and its providers' import-time code catches broad exceptions in places; a
    command calls this before it prints a result, so an interrupt never yields a report.
    """
    if _interrupted:
        raise KeyboardInterrupt


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="airflow-dataset-race-fix",
        description="Dataset-triggered scheduling in Airflow 2.10/2.11 that loses no events.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"airflow_dataset_race_fix.commands.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    # First, before the subcommands import anything heavy: remember every Ctrl-C (see
    # check_interrupted). A SIGINT that our parent ignores (a background job) stays ignored.
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_interrupt)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        status = int(args.handler(args) or 0)
        check_interrupted()
        return status
    except UsageError as err:
        print(f"airflow-dataset-race-fix {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
