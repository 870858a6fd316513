"""
airflow-dataset-race-fix start-up shim (the logic: ``airflow_dataset_race_fix.bootstrap``).
With this directory on PYTHONPATH, Python imports this file at start-up. It imports the
sitecustomize this one hides (this directory off ``sys.path`` meanwhile), then, on the Pythons
this package supports, registers the hooks that patch Airflow when it is imported. It never
imports Airflow and never raises: a failure is printed on stderr, as site.py does.
"""

import os
import sys

# Any Python that inherits PYTHONPATH runs this file, Python 2.7 included: keep its text
# to what every one of them parses and runs (no f-strings, no annotations, no names that
# Python 2 lacks), and start the shim only where this package runs (setup.cfg's
# python_requires); elsewhere chain the next sitecustomize and stay silent.
MIN_PYTHON = (3, 9)
# Python 2 empties a module's globals once nothing refers to it, which happens when a chained
# sitecustomize takes this one's place in sys.modules: this reference keeps it whole.
_this_module = sys.modules.get(__name__)


def _is_this_directory(entry, here):
    try:
        return os.path.realpath(entry or os.curdir) == here
    except Exception:
        return False


def _chain_next_sitecustomize():
    """Import the next sitecustomize on the path; return its file (None if there is none)."""
    here = os.path.dirname(os.path.realpath(__file__))
    ours = sys.modules.get("sitecustomize")
    positions = [i for i, entry in enumerate(sys.path) if _is_this_directory(entry, here)]
    for i in reversed(positions):
        del sys.path[i]
    del sys.modules["sitecustomize"]
    try:
        import sitecustomize as chained  # noqa: F401 (the next one on the path, if any)
    except ImportError as err:
        if _missing_module(err) != "sitecustomize":
            _report_chained_error()
        chained = None
    except BaseException:  # including SystemExit from a user's file: site.py would report it too
        _report_chained_error()
        chained = None
    finally:
        for i in positions:  # back where they were, so sys.path reads as the user set it
            sys.path.insert(min(i, len(sys.path)), here)
    if chained is None:
        sys.modules["sitecustomize"] = ours
        return None
    # Like dd-trace: the user's module stays under its own name for code that imports it.
    return getattr(chained, "__file__", repr(chained))


def _missing_module(err):
    """The name of the module an ImportError did not find (Python 2 has only the message)."""
    name = getattr(err, "name", None)
    if name is None and str(err).startswith("No module named "):
        name = str(err)[len("No module named ") :].strip("'")
    return name


def _report_chained_error():
    if sys.flags.verbose:
        import traceback

        traceback.print_exc()
    else:
        err = sys.exc_info()[1]
        sys.stderr.write(
            "Error in sitecustomize; set PYTHONVERBOSE for traceback:\n%s: %s\n" % (type(err).__name__, err)
        )


def _start():
    chained = _chain_next_sitecustomize()
    if sys.version_info < MIN_PYTHON:
        return False
    from airflow_dataset_race_fix import bootstrap

    bootstrap.chained_sitecustomize = chained
    bootstrap.start_quietly(bootstrap.ROUTE_SITECUSTOMIZE)
    return True


if __name__ == "sitecustomize":  # not when imported as airflow_dataset_race_fix._bootstrap.sitecustomize
    try:
        loaded = _start()  # read by tests: the shim started without an error
    except Exception as _err:
        loaded = False
        # Silent when this interpreter has no airflow_dataset_race_fix (another Python or
        # virtualenv inherited PYTHONPATH): nothing to fix here.
        if not isinstance(_err, ImportError) or getattr(_err, "name", None) not in (
            "airflow_dataset_race_fix",
            "airflow_dataset_race_fix.bootstrap",
        ):
            sys.stderr.write(
                "airflow-dataset-race-fix: shim not started: %s: %s\n" % (type(_err).__name__, _err)
            )
