"""
``airflow-dataset-race-fix`` (also ``python -m airflow_dataset_race_fix``).

Each subcommand lives in ``airflow_dataset_race_fix.commands.<name>`` and exposes
``register(subparsers)``; this module only wires them. Importing it imports nothing from
Airflow: subcommands import what they need when they run.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from airflow_dataset_race_fix import __version__
from airflow_dataset_race_fix.diagnostics.database import DatabaseError

# Subcommand modules, in the order --help lists them.
COMMAND_MODULES = ("status", "deployment", "shim", "source_patches", "audit", "explain")

# The reader of stdout (or stderr) went away, as in 'audit | head -1': the status a shell
# reports for a tool killed by SIGPIPE (128 + 13). No command gives it a verdict's meaning,
# so 'audit | grep -q ...' under pipefail never reads it as "findings" (1) or "bad input" (2).
EXIT_BROKEN_PIPE = 128 + 13


class UsageError(Exception):
    """Bad input from the user: printed as one clear line, exit code 2."""


_interrupted = False


def _on_interrupt(signum, frame) -> None:
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


def check_interrupted() -> None:
    """Raise KeyboardInterrupt if Ctrl-C came, even if some library caught the first one.

    Airflow's and its providers' import-time code catches broad exceptions in places; so a
    command checks before it prints a result, and an interrupt never yields a report.
    """
    if _interrupted:
        raise KeyboardInterrupt


def print_result(text: str) -> None:
    """Print a command's result on stdout: not after a Ctrl-C, and not cut by a later one.

    From here on SIGINT is ignored, so the result printed and the exit status that goes with
    it stay together (main() puts the previous handler back when called in-process).
    """
    check_interrupted()
    if signal.getsignal(signal.SIGINT) is _on_interrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    print(text, flush=True)


def _silence_broken_streams(*streams) -> bool:
    """Point ``streams`` (default: stdout and stderr) whose reader is gone at /dev/null;
    whether one was.

    As the Python documentation recommends for SIGPIPE: without it, the interpreter's own
    flush at exit fails again and prints a traceback.
    """
    import select

    silenced = False
    for stream in streams or (sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            broken = any(events & select.POLLERR for _, events in poller.poll(0))
        except (AttributeError, OSError, ValueError):  # no file descriptor (replaced in-process)
            continue
        if broken:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
            silenced = True
    return silenced


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="airflow-dataset-race-fix",
        description="Dataset-triggered scheduling in Airflow 2.10/2.11 that loses no events.",
        epilog=f"Every command exits {EXIT_BROKEN_PIPE} when the reader of its output went away "
        "('audit | head -1'), as a tool killed by SIGPIPE does; 130 when interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"airflow_dataset_race_fix.commands.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default: this process's); its exit status.

    With ``argv`` given (an in-process caller), the caller's SIGINT handler is put back after.
    """
    global _interrupted
    _interrupted = False
    previous = signal.getsignal(signal.SIGINT)
    # First, before the subcommands import anything heavy: remember every Ctrl-C (see
    # check_interrupted). A SIGINT that our parent ignores (a background job) stays ignored.
    if previous is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_interrupt)
    try:
        return _run(argv)
    except BrokenPipeError:  # also from the error lines below, written to a closed stderr
        if not _silence_broken_streams():
            raise  # not our stdout or stderr: a bug to see, with its traceback
        return EXIT_BROKEN_PIPE
    finally:
        if argv is not None and previous is not None:
            signal.signal(signal.SIGINT, previous)


def _run(argv: list[str] | None) -> int:
    command = None
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as err:
            # argparse swallows a failed write of --help and --version (and exits 0)
            if err.code == 0 and _silence_broken_streams(sys.stdout):
                return EXIT_BROKEN_PIPE
            raise
        command = args.command
        if not getattr(args, "handler", None):
            parser.print_help()
            return EXIT_BROKEN_PIPE if _silence_broken_streams(sys.stdout) else 2
        status = int(args.handler(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        check_interrupted()
        return status
    except (UsageError, DatabaseError) as err:  # a database that cannot be read as asked is bad input too
        print(f"airflow-dataset-race-fix {command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
