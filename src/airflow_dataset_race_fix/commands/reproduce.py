"""``reproduce``: prove the bug on stock Airflow and its absence with the fix.

The lab lives in the repository's ``reproduce/``, not in the wheel: this runs the clone's,
next to the ``src`` of an editable install (what ``reproduce/run`` makes) or in the working
directory.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from airflow_dataset_race_fix.cli import UsageError

NO_LAB = ("the reproduction lives in the repository, not in the installed package: git clone the "
          "airflow-dataset-race-fix repository && cd airflow-dataset-race-fix && reproduce/run")


def register(subparsers) -> None:
    texts = dict(
        help="show the races on stock Airflow and show them gone with the fix (from a clone of the repository)",
        description="Run the race scenarios (default), a stress run (--stress) or a real scheduler (--e2e) "
        "against stock Airflow and against the fix, each in its own interpreter and scratch database.",
    )
    runner = _lab_runner()
    if runner is None:  # whatever the options (--help too), the answer is where the lab is
        parser = subparsers.add_parser("reproduce", **texts, add_help=False, prefix_chars="\0")
        parser.add_argument("options", nargs="*")
        parser.set_defaults(handler=_no_lab)
    else:
        parser = subparsers.add_parser("reproduce", **texts)
        runner.add_arguments(parser)
        parser.set_defaults(handler=runner.main)


def _lab_runner():
    """The clone's ``reproduce.runner``, or None. The lab is loaded from its file, not from
    sys.path, where the working directory may hold another ``reproduce``."""
    lab = sys.modules.get("reproduce")
    if getattr(lab, "__path__", None) is None:
        import airflow_dataset_race_fix

        roots = (Path(airflow_dataset_race_fix.__file__).resolve().parents[2], Path.cwd())
        init = next((r / "reproduce" / "__init__.py" for r in roots if (r / "reproduce" / "runner.py").is_file()), None)
        if init is None:
            return None
        spec = importlib.util.spec_from_file_location("reproduce", init)
        sys.modules["reproduce"] = lab = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(lab)
    return importlib.import_module("reproduce.runner")


def _no_lab(args) -> int:
    raise UsageError(NO_LAB)
