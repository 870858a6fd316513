"""``reproduce``: prove the bug on stock Airflow and its absence with the fix.

The lab (scenarios, stress and e2e runs) lives in the repository's ``reproduce/``, not in the
wheel: this command runs the clone's, found next to the ``src`` this package runs from (an
editable install from the clone, as ``reproduce/run`` makes) or in the working directory.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path

from airflow_dataset_race_fix.cli import UsageError

NO_LAB = (
    "the reproduction lives in the repository, not in the installed package: git clone the "
    "airflow-dataset-race-fix repository && cd airflow-dataset-race-fix && reproduce/run"
)


def register(subparsers) -> None:
    texts = {
        "help": "show the races on stock Airflow and show them gone with the fix (from a clone of the repository)",
        "description": "Run the race scenarios (default), a stress run (--stress) or a real scheduler (--e2e) "
        "against stock Airflow and against the fix, each in its own interpreter and scratch database.",
    }
    runner = _lab_runner()
    if runner is None:  # whatever the options (--help too), the answer is where the lab is
        parser = subparsers.add_parser("reproduce", **texts, add_help=False, prefix_chars="\0")
        parser.add_argument("options", nargs="*")
        parser.set_defaults(handler=_no_lab)
        return
    parser = subparsers.add_parser("reproduce", **texts)
    runner.add_arguments(parser)
    parser.set_defaults(handler=runner.main)


def _lab_runner():
    """The clone's ``reproduce.runner``, or None outside a clone. The lab package is loaded from
    its file, not from sys.path, where the working directory may hold another ``reproduce``."""
    lab = sys.modules.get("reproduce")
    if getattr(lab, "__path__", None) is None:
        import airflow_dataset_race_fix

        for root in (Path(airflow_dataset_race_fix.__file__).resolve().parents[2], Path.cwd()):
            if (root / "reproduce" / "runner.py").is_file():
                spec = importlib.util.spec_from_file_location("reproduce", root / "reproduce" / "__init__.py")
                sys.modules["reproduce"] = lab = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(lab)
                break
        else:
            return None
    return importlib.import_module("reproduce.runner")


def _no_lab(args: argparse.Namespace) -> int:
    raise UsageError(NO_LAB)
