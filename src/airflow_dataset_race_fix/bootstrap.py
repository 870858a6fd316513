"""
The start-up shim's logic: register post-import hooks that put the fix in place. Each route
(docs/activation.md, "Routes") calls :func:`start`; the switches: docs/settings.md. At
interpreter start nothing but ``os`` and ``sys`` is imported: ``targets.py`` (``inspect``) when
``airflow`` is, the patching (``runtime.py``) when a target is. Strict mode makes every later
import of a target raise too: Airflow's CLI swallows some import errors, and a failed module
leaves ``sys.modules``, so the next import would get the stock code.
"""

from __future__ import annotations

import os
import sys

ENV_DISABLED = "AIRFLOW_DATASET_RACE_FIX_DISABLED"
ENV_STRICT = "AIRFLOW_DATASET_RACE_FIX_STRICT"
SWITCHES = (ENV_DISABLED, ENV_STRICT)

ROUTE_SITECUSTOMIZE = "sitecustomize"
ROUTE_PTH = "pth"
ROUTE_IMPORT = "import"
ROUTE_LOCAL_SETTINGS = "airflow_local_settings"
ROUTE_PLUGIN = "plugin"

# What happened in this interpreter, for ``status`` and for tests.
routes: list[str] = []  # every route that called start(), first one first
started = False  # hooks registered
disabled = False  # start() saw the disable switch
chained_sitecustomize: str | None = None  # file of the sitecustomize our boilerplate chained
errors: list[str] = []  # unexpected failures, already logged; the process carried on


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def strict() -> bool:
    return env_flag(ENV_STRICT)


def start(route: str) -> None:
    """Register the hooks once per interpreter (idempotent; honours the disable switch). Strict
    mode raises :class:`runtime.RefusedError` when a target already imported cannot be patched."""
    global started, disabled
    if route not in routes:
        routes.append(route)
    if started or disabled:
        return
    if env_flag(ENV_DISABLED):
        disabled = True
        return
    started = True
    from airflow_dataset_race_fix import post_import

    post_import.when_imported("airflow", _watch_targets)


def start_quietly(route: str) -> None:
    """:func:`start` for the start-up routes (sitecustomize, .pth): report, never raise."""
    try:
        start(route)
    except Exception as err:
        errors.append(f"start: {type(err).__name__}: {err}")
        sys.stderr.write(f"airflow-dataset-race-fix: {err}\n")


def stop() -> None:
    """Forget the hooks still waiting and restore every original (tests, interactive use)."""
    global started
    from airflow_dataset_race_fix import post_import

    post_import.cancel()
    started = False
    if "airflow_dataset_race_fix.runtime" in sys.modules:
        sys.modules["airflow_dataset_race_fix.runtime"].unapply()


def _watch_targets(_airflow: object) -> None:
    # Registering on 'airflow' first keeps targets.py (and inspect) out of processes that
    # never import Airflow; a target imported while airflow/__init__ ran is patched here.
    from airflow_dataset_race_fix import post_import
    from airflow_dataset_race_fix.targets import TARGET_MODULES

    for name in TARGET_MODULES:
        post_import.when_imported(name, _patch_target)


def _patch_target(module: object) -> None:
    from airflow_dataset_race_fix import runtime

    strict_mode = strict()
    try:
        runtime.on_import(module, strict=strict_mode)
    except runtime.RefusedError as err:
        _refuse_later_imports(err)
        raise
    except Exception as err:  # a bug of ours must not stop Airflow from importing
        if strict_mode:
            raise
        name = getattr(module, "__name__", module)
        errors.append(f"{name}: {type(err).__name__}: {err}")
        runtime.log.warning(
            "airflow-dataset-race-fix: unexpected error while patching %s; the process carries on without "
            "the fix for it. Please report it with the output of 'airflow-dataset-race-fix status --json'.",
            name,
            exc_info=True,
        )


class _RefusedImports:
    """Meta-path finder of strict mode after a refusal: every import of a target raises it again."""

    def __init__(self, error: Exception) -> None:
        from airflow_dataset_race_fix.targets import TARGET_MODULES

        self.error = error
        self.names = frozenset(TARGET_MODULES)

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname in self.names:
            raise type(self.error)(*self.error.args)
        return None


def _refuse_later_imports(error: Exception) -> None:
    if not any(isinstance(finder, _RefusedImports) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RefusedImports(error))
