"""
The ``airflow.plugins`` entry point that turns the shim on, only with ``[dataset_race_fix]
enable_via_plugin = True`` (docs/activation.md, "Managed platforms"); importing this module does
nothing (Airflow's ``getattr`` of ``plugin`` does). Airflow loads plugins after the targets are
imported, so the shim patches them at once, unless a targeted member is running then (half fixed:
refused). Strict mode raises ``SystemExit``: the plugin manager swallows a plugin's exceptions.
"""

from __future__ import annotations

import sys

OPT_IN_SECTION = "dataset_race_fix"
OPT_IN_KEY = "enable_via_plugin"
OPT_IN_ENV = "AIRFLOW__DATASET_RACE_FIX__ENABLE_VIA_PLUGIN"
PLUGIN_NAME = "airflow_dataset_race_fix"

_loaded = False
_plugin: type | None = None


def __getattr__(name: str):
    # The entry point is 'airflow_dataset_race_fix.plugin:plugin'.
    global _loaded, _plugin
    if name != "plugin":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if not _loaded:
        _loaded = True
        _plugin = _load()
    return _plugin


def opted_in() -> bool:
    """The opt-in, read as Airflow reads its options (airflow.cfg, then AIRFLOW__... wins)."""
    from airflow.configuration import conf

    return conf.getboolean(OPT_IN_SECTION, OPT_IN_KEY, fallback=False)


def members_running() -> list[str]:
    """Targeted members whose original code runs in some thread of this process right now."""
    import inspect

    from airflow_dataset_race_fix.targets import MEMBERS

    codes = {}
    for member in MEMBERS:
        owner = getattr(sys.modules.get(member.module), member.owner, None)
        attribute = vars(owner).get(member.name) if owner is not None else None
        function = getattr(attribute, "__func__", attribute)
        if callable(function):
            # The innermost function: decorators' wrappers are shared by other functions.
            code = getattr(inspect.unwrap(function), "__code__", None)
            if code is not None:
                codes[code] = member.qualname
    running: list[str] = []
    for frame in sys._current_frames().values():
        while frame is not None:
            qualname = codes.get(frame.f_code)
            if qualname is not None and qualname not in running:
                running.append(qualname)
            frame = frame.f_back
    return running


def _load() -> type | None:
    from airflow_dataset_race_fix import bootstrap

    try:
        if not opted_in():
            return None  # installed, not opted in: nothing more is imported, nothing registered
        _start(bootstrap)
    except Exception as err:  # a bug of ours, or an opt-in value Airflow cannot read as a boolean
        _failed(bootstrap, err)
        return None
    return _plugin_class()


def _start(bootstrap) -> None:
    from airflow_dataset_race_fix import runtime

    if bootstrap.ROUTE_PLUGIN not in bootstrap.routes:
        bootstrap.routes.append(bootstrap.ROUTE_PLUGIN)
    # Another route may have started the shim already; then its hooks own the targets.
    running = [] if bootstrap.started or bootstrap.env_flag(bootstrap.ENV_DISABLED) else members_running()
    try:
        if running:
            runtime.refuse(
                runtime.ModuleState(
                    running[0].rsplit(".", 2)[0],
                    runtime.REFUSED,
                    f"Airflow loaded its plugins (the plugin route) while {', '.join(running)} was "
                    "already running in this process: patched then, the rest of that call would "
                    "run half fixed. Nothing was patched: in this program, turn the fix on with "
                    "airflow_local_settings.py or PYTHONPATH",
                ),
                strict=bootstrap.strict(),
            )
        else:
            bootstrap.start(bootstrap.ROUTE_PLUGIN)
    except runtime.RefusedError as err:
        # The plugin manager would log and swallow it, and run stock: strict mode exits.
        raise SystemExit(str(err)) from err


def _failed(bootstrap, err: Exception) -> None:
    import logging

    if bootstrap.strict():
        raise SystemExit(f"airflow-dataset-race-fix (strict): the plugin route failed: {err}") from err
    bootstrap.errors.append(f"plugin: {type(err).__name__}: {err}")
    logging.getLogger("airflow_dataset_race_fix").warning(
        "airflow-dataset-race-fix: the plugin route failed (%s: %s); this process carries on without the fix",
        type(err).__name__,
        err,
        exc_info=True,
    )


def _plugin_class() -> type:
    from airflow.plugins_manager import AirflowPlugin

    class DatasetRaceFixPlugin(AirflowPlugin):
        """Listed by 'airflow plugins' and the web UI: the opt-in was read in that process."""

        name = PLUGIN_NAME

    return DatasetRaceFixPlugin
