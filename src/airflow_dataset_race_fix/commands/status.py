"""
``status``: is the fix active in this environment, and if not, why.

Reports the Airflow version and whether it is supported, how the shim is activated
(PYTHONPATH, a .pth file, airflow_local_settings.py, the plugin's opt-in; loaded in this
very process or not), the sitecustomize it chains, the switches, and per target module:
fixed by the shim, fixed by a source patch, waiting for import, refused (why), or not
fixed. The status process is itself a Python process of this environment, so it imports
the target modules (unless --no-import), and loads Airflow's plugins when the plugin's
opt-in is on, as Airflow's processes do before they use a target; then it looks at what
actually happened to them here. An apply or revert of the source patches that was killed
half way is reported too.

``--json``: Airflow logs to stdout, so when something imports Airflow at interpreter start,
its lines precede the document, which starts at the first line that is ``{``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys

FIXED_BY_SHIM = "fixed-by-shim"
FIXED_BY_SOURCE = "fixed-by-source-patch"
WAITING = "waiting-for-import"
REFUSED = "refused"
NOT_FIXED = "not-fixed"
IMPORT_FAILED = "import-failed"

EXIT_ACTIVE = 0
EXIT_NOT_ACTIVE = 1


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "status",
        help="is the fix active in this environment (exit 0) or not (exit 1), and why",
        description=__doc__.split("\n\n")[1],  # shown as is: that paragraph stays plain text
        epilog="Exit code: 0 when the fix is active for every target module, 1 when it is not.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--no-import",
        action="store_true",
        help="do not import Airflow (a quick check, e.g. in an "
        "image build): with a route turned on (the plugin's opt-in read from the environment or "
        "airflow.cfg), targets show as waiting for import; fingerprints are not checked",
    )
    parser.set_defaults(handler=run)


def run(args) -> int:
    report = collect(import_targets=not args.no_import)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return EXIT_ACTIVE if report["fix_active"] else EXIT_NOT_ACTIVE


def collect(import_targets: bool = True) -> dict:
    from airflow_dataset_race_fix import BOOTSTRAP_DIR, activation, bootstrap
    from airflow_dataset_race_fix.targets import SUPPORTED_AIRFLOW_VERSIONS, TARGET_MODULES, release_of

    # Importing Airflow logs (our own warnings too) to stdout; keep stdout for the report.
    import_errors: dict[str, str] = {}
    plugin_error = None
    if import_targets:
        with contextlib.redirect_stdout(sys.stderr):
            for name in TARGET_MODULES:
                try:
                    importlib.import_module(name)
                except Exception as err:  # RefusedError in strict mode, or a broken install
                    import_errors[name] = f"{type(err).__name__}: {err}"
            plugin_error = _load_plugins_if_opted_in()

    from airflow_dataset_race_fix import runtime

    version = runtime.airflow_version()
    release = release_of(version)
    supported = release is not None
    shim = _shim_report(BOOTSTRAP_DIR, activation, bootstrap)
    if plugin_error:
        shim["notes"].append(f"loading Airflow's plugins failed: {plugin_error}")
    targets = [_target_report(name, import_errors.get(name), shim, runtime) for name in TARGET_MODULES]
    interrupted = _interrupted_source_patches()
    if interrupted:
        shim["notes"].append(interrupted)
    fix_active = not interrupted and all(
        t["status"] in (FIXED_BY_SHIM, FIXED_BY_SOURCE) or (t["status"] == WAITING and supported)
        for t in targets
    )
    return {
        "airflow": {
            "version": version,
            "supported": supported,
            "supported_versions": list(SUPPORTED_AIRFLOW_VERSIONS),
            "local_build_of": release if supported and release != version else None,
        },
        "shim": shim,
        "targets": targets,
        "fix_active": fix_active,
    }


def _load_plugins_if_opted_in() -> str | None:
    """With the plugin's opt-in on, load Airflow's plugins as Airflow's processes do; why it failed."""
    from airflow_dataset_race_fix import activation

    if not activation.plugin_opt_in()[0]:
        return None
    try:
        from airflow import plugins_manager

        plugins_manager.ensure_plugins_loaded()
    except SystemExit as err:  # strict mode: the plugin route fails closed
        return f"SystemExit: {err}"
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return None


def _interrupted_source_patches() -> str | None:
    """Why the source patches are mid-change (an apply or revert was killed), or None."""
    from airflow_dataset_race_fix.source_patches import applier, record

    site_packages = record.default_site_packages()
    if site_packages is None or not (site_packages / applier.BACKUP_DIR / applier.JOURNAL).exists():
        return None
    return (
        f"an apply or revert of the source patches in {site_packages} did not finish (killed?): until "
        "'airflow-dataset-race-fix apply' or 'revert' finishes it, the scheduler's file may be missing"
    )


def _shim_report(bootstrap_dir: str, activation, bootstrap) -> dict:
    on_pythonpath = activation.pythonpath_entries()
    pth_files = activation.installed_pth_files()
    local_settings = activation.local_settings_file()
    local_settings_imports = local_settings is not None and activation.imports_the_fix(local_settings)
    plugin_on, plugin_read_from = activation.plugin_opt_in()
    entry_point = activation.plugin_entry_point()
    activated_by = (
        (["PYTHONPATH"] if on_pythonpath else [])
        + ([".pth"] if pth_files else [])
        + ([bootstrap.ROUTE_LOCAL_SETTINGS] if local_settings_imports else [])
        + ([bootstrap.ROUTE_PLUGIN] if plugin_on and entry_point else [])
    )
    notes = []
    if plugin_on and not entry_point:
        notes.append(
            "[dataset_race_fix] enable_via_plugin is on, but the installed package has no airflow.plugins "
            "entry point: reinstall airflow-dataset-race-fix"
        )
    if on_pythonpath and bootstrap.ROUTE_SITECUSTOMIZE not in bootstrap.routes and not bootstrap.disabled:
        hiding = getattr(sys.modules.get("sitecustomize"), "__file__", None)
        notes.append(
            "the bootstrap directory is on PYTHONPATH but its sitecustomize did not run in this process"
            + (f": {hiding} was imported instead" if hiding else "")
            + " (put the bootstrap directory first; where a tool puts its own first, as "
            "opentelemetry-instrument does, use the .pth route: 'airflow-dataset-race-fix shim install-pth')"
        )
    if bootstrap.disabled:
        notes.append(f"disabled by {bootstrap.ENV_DISABLED}")
    chained = bootstrap.chained_sitecustomize
    return {
        "bootstrap_dir": bootstrap_dir,
        "activated_by": activated_by,
        "pythonpath_entries": on_pythonpath,
        "pth_files": pth_files,
        "local_settings_file": local_settings,
        "local_settings_imports_fix": local_settings_imports,
        "plugin_opt_in": plugin_on,
        "plugin_opt_in_read_from": plugin_read_from,
        "plugin_entry_point": entry_point,
        "loaded_in_this_process": bootstrap.started,
        "routes_in_this_process": list(bootstrap.routes),
        "disabled": bootstrap.disabled,
        "strict": bootstrap.strict(),
        "switches": {name: os.environ.get(name) for name in bootstrap.SWITCHES},
        "chained_sitecustomize": chained,
        "other_sitecustomize_on_path": None if chained else activation.next_sitecustomize(),
        "errors": list(bootstrap.errors),
        "notes": notes,
    }


def _target_report(name: str, import_error: str | None, shim: dict, runtime) -> dict:
    if import_error is not None:
        # Strict mode: the refusal surfaced as the import's RefusedError.
        status = REFUSED if import_error.startswith("RefusedError") else IMPORT_FAILED
        return {"module": name, "status": status, "detail": import_error}
    state = runtime.module_state(name)
    status = {
        runtime.PATCHED: FIXED_BY_SHIM,
        runtime.SOURCE_PATCHED: FIXED_BY_SOURCE,
        runtime.REFUSED: REFUSED,
    }
    if state.state in status:
        return {"module": name, "status": status[state.state], "detail": state.detail}
    why = _why_inactive(shim)
    if state.state == runtime.PENDING:
        from airflow_dataset_race_fix.bootstrap import ROUTE_LOCAL_SETTINGS, ROUTE_PLUGIN

        # Routes that start inside Airflow's own start-up: nothing to see before it is imported.
        late_routes = [r for r in shim["activated_by"] if r in (ROUTE_LOCAL_SETTINGS, ROUTE_PLUGIN)]
        if why and late_routes and "airflow" not in sys.modules:
            routes = " and ".join(late_routes)
            detail = f"the shim starts from {routes} once Airflow is imported (not checked: --no-import)"
            return {"module": name, "status": WAITING, "detail": detail}
        if why:
            return {"module": name, "status": NOT_FIXED, "detail": f"not imported; {why}"}
        detail = "the shim patches it when it is imported (fingerprints not checked: --no-import)"
        return {"module": name, "status": WAITING, "detail": detail}
    return {
        "module": name,
        "status": NOT_FIXED,
        "detail": f"original Airflow code; {why or 'the shim did not run'}",
    }


def _why_inactive(shim: dict) -> str:
    if shim["disabled"]:
        return "the shim is disabled by AIRFLOW_DATASET_RACE_FIX_DISABLED"
    if not shim["loaded_in_this_process"]:
        from airflow_dataset_race_fix import verdict

        why = verdict.why_not_started()
        if why and why[1].startswith("displaced"):
            return f"the shim is {why[1]}"
        return (
            "the shim is not active in this environment: put the bootstrap directory on PYTHONPATH, "
            "run 'airflow-dataset-race-fix shim install-pth', import airflow_dataset_race_fix.auto in "
            "airflow_local_settings.py, or set [dataset_race_fix] enable_via_plugin = True"
        )
    return ""


def render(report: dict) -> str:
    airflow, shim = report["airflow"], report["shim"]
    supported = (
        "supported"
        if airflow["supported"]
        else (
            f"NOT supported; supported: {', '.join(airflow['supported_versions'])}, and local builds of them"
        )
    )
    if airflow["local_build_of"]:
        supported = f"a local build of {airflow['local_build_of']}: judged by its targeted members"
    loaded = (
        f"yes, via {', '.join(shim['routes_in_this_process'])}" if shim["loaded_in_this_process"] else "no"
    )
    lines = [
        f"Airflow: {airflow['version'] or 'not installed'} ({supported})",
        f"Shim activated by: {', '.join(shim['activated_by']) or 'nothing (not activated)'}",
        f"  bootstrap directory: {shim['bootstrap_dir']}",
    ]
    lines += [f"  .pth file: {path}" for path in shim["pth_files"]]
    if shim["local_settings_file"]:
        imports = "imports" if shim["local_settings_imports_fix"] else "does not import"
        lines.append(
            f"  airflow_local_settings: {shim['local_settings_file']} "
            f"({imports} airflow_dataset_race_fix.auto)"
        )
    lines.append(
        f"  plugin opt-in [dataset_race_fix] enable_via_plugin: {'on' if shim['plugin_opt_in'] else 'off'} "
        f"(read from {shim['plugin_opt_in_read_from']})"
    )
    lines += [
        f"  loaded in this process: {loaded}",
        "  switches: "
        + ", ".join(f"{k}={v if v is not None else '(unset)'}" for k, v in shim["switches"].items()),
        f"  chained sitecustomize: {shim['chained_sitecustomize'] or 'none'}",
    ]
    if shim["other_sitecustomize_on_path"]:
        lines.append(
            f"  other sitecustomize on the path (not chained): {shim['other_sitecustomize_on_path']}"
        )
    lines += [f"  note: {note}" for note in shim["notes"]]
    lines += [f"  error: {error}" for error in shim["errors"]]
    lines.append("Targets:")
    for target in report["targets"]:
        lines.append(f"  {target['module']}: {target['status']}")
        if target["detail"]:
            lines.append(f"      {target['detail']}")
    lines.append("Fix active: " + ("yes" if report["fix_active"] else "NO"))
    return "\n".join(lines)
