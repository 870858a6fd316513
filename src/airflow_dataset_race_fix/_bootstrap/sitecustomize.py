"""
airflow-dataset-race-fix start-up shim. Boilerplate only: the logic is in
``airflow_dataset_race_fix.bootstrap``.

With this directory on PYTHONPATH, Python imports this file at start-up. It
1. imports the sitecustomize that this one hides (the user's or the distribution's), so
   that one still runs, with this directory taken off ``sys.path`` meanwhile;
2. registers the post-import hooks that patch Airflow when Airflow is imported.
It never imports Airflow and never raises: a failure is printed on stderr, like site.py
reports a failing sitecustomize, and the interpreter carries on.
"""

import os
import sys

# Kept in Python 3 syntax any interpreter understands: an unrelated Python that inherits
# PYTHONPATH must still start.


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
    except ModuleNotFoundError as err:
        if err.name != "sitecustomize":
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
    from airflow_dataset_race_fix import bootstrap

    bootstrap.chained_sitecustomize = chained
    bootstrap.start_quietly(bootstrap.ROUTE_SITECUSTOMIZE)


if __name__ == "sitecustomize":  # not when imported as airflow_dataset_race_fix._bootstrap.sitecustomize
    try:
        _start()
        loaded = True  # read by tests: the boilerplate finished without an error
    except ImportError as _err:
        # This interpreter has no airflow_dataset_race_fix (another Python or virtualenv
        # inherited PYTHONPATH): nothing to fix here, stay silent.
        loaded = False
        if getattr(_err, "name", None) not in ("airflow_dataset_race_fix", "airflow_dataset_race_fix.bootstrap"):
            sys.stderr.write("airflow-dataset-race-fix: shim not started: %s: %s\n" % (type(_err).__name__, _err))
    except Exception as _err:
        loaded = False
        sys.stderr.write("airflow-dataset-race-fix: shim not started: %s: %s\n" % (type(_err).__name__, _err))
