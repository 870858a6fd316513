"""
How the shim is (or can be) activated: PYTHONPATH, a ``.pth`` file, ``airflow_local_settings.py``,
the plugin's opt-in; for ``status`` and ``shim``, never at interpreter start. ``site`` runs the
``.pth`` line in every interpreter, so it must be cheap, and silent once this package is gone.
"""

from __future__ import annotations

import ast
import os
import sys
import sysconfig
from pathlib import Path

from airflow_dataset_race_fix import BOOTSTRAP_DIR

PTH_FILENAME = "airflow_dataset_race_fix_shim.pth"
PTH_LINE = (
    'import sys; exec("try:\\n import airflow_dataset_race_fix.bootstrap as _adrf\\n'
    'except ImportError:\\n pass\\nelse:\\n _adrf.start_quietly(_adrf.ROUTE_PTH)")\n'
)
PTH_CONTENT = (
    "# airflow-dataset-race-fix: turns the shim on in every interpreter of this environment.\n"
    "# Remove with 'airflow-dataset-race-fix shim remove-pth' (or delete this file), before\n"
    "# 'pip uninstall airflow-dataset-race-fix': pip leaves it behind (it then does nothing).\n" + PTH_LINE
)


def _same_directory(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def pythonpath_entries(environ: dict[str, str] | os._Environ = os.environ) -> list[str]:
    """Entries of PYTHONPATH that are the bootstrap directory."""
    return [
        e for e in environ.get("PYTHONPATH", "").split(os.pathsep) if e and _same_directory(e, BOOTSTRAP_DIR)
    ]


def site_directories() -> list[str]:
    """The directories whose ``.pth`` files this interpreter processes (or would, without -S)."""
    import site

    directories = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        directories.append(site.getusersitepackages())
    return list(dict.fromkeys(directories))


def installed_pth_files() -> list[str]:
    paths = (os.path.join(d, PTH_FILENAME) for d in site_directories())
    return [path for path in paths if os.path.isfile(path)]


def default_site_directory() -> str:
    """Where ``install-pth`` writes by default: this interpreter's site-packages."""
    return sysconfig.get_paths()["purelib"]


def install_pth(site_dir: str | None = None) -> tuple[str, bool]:
    """Write the ``.pth`` file (atomically); returns (path, changed). Idempotent."""
    site_dir = site_dir or default_site_directory()
    path = os.path.join(site_dir, PTH_FILENAME)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as existing:
            if existing.read() == PTH_CONTENT:
                return path, False
    from airflow_dataset_race_fix.source_patches.safe_write import atomic_write

    atomic_write(Path(path), PTH_CONTENT.encode("utf-8"))  # a half-written .pth would run meanwhile
    return path, True


def remove_pth(site_dir: str | None = None) -> list[str]:
    """Delete the ``.pth`` file from ``site_dir`` (default: every site directory); returns what went."""
    directories = [site_dir] if site_dir else site_directories()
    removed = []
    for directory in directories:
        path = os.path.join(directory, PTH_FILENAME)
        if os.path.isfile(path):
            os.unlink(path)
            removed.append(path)
    return removed


def next_sitecustomize() -> str | None:
    """The sitecustomize that Python would import if the bootstrap directory were not there."""
    from importlib.machinery import PathFinder

    path = [e for e in sys.path if not _same_directory(e or os.curdir, BOOTSTRAP_DIR)]
    spec = PathFinder.find_spec("sitecustomize", path)
    return spec.origin if spec is not None else None


def local_settings_file() -> str | None:
    """The ``airflow_local_settings.py`` that Airflow imports (or would) in this environment."""
    module = sys.modules.get("airflow_local_settings")
    if module is not None:
        return getattr(module, "__file__", None)
    from importlib.machinery import PathFinder

    # Before importing it, Airflow appends $AIRFLOW_HOME/config and the plugins folder to sys.path.
    settings = sys.modules.get("airflow.settings")
    home = getattr(settings, "AIRFLOW_HOME", None) or os.path.expanduser(
        os.environ.get("AIRFLOW_HOME", "~/airflow")
    )
    plugins = getattr(settings, "PLUGINS_FOLDER", None) or os.environ.get(
        "AIRFLOW__CORE__PLUGINS_FOLDER", os.path.join(home, "plugins")
    )
    spec = PathFinder.find_spec("airflow_local_settings", [*sys.path, os.path.join(home, "config"), plugins])
    return spec.origin if spec is not None and spec.has_location else None


def imports_the_fix(path: str) -> bool:
    """Whether ``path`` (a Python file) imports ``airflow_dataset_race_fix.auto`` in code, not a comment."""
    try:
        with open(path, encoding="utf-8") as source:
            tree = ast.parse(source.read(), path)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(
            a.name == "airflow_dataset_race_fix.auto" for a in node.names
        ):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "airflow_dataset_race_fix":
            if any(a.name == "auto" for a in node.names):
                return True
    return False


def plugin_opt_in() -> tuple[bool, str]:
    """Whether ``[dataset_race_fix] enable_via_plugin`` is on, and where that was read: Airflow's
    configuration once imported, else as Airflow would read it (environment, else airflow.cfg)."""
    from airflow_dataset_race_fix import plugin

    if "airflow.configuration" in sys.modules:
        try:
            return plugin.opted_in(), "Airflow's configuration"
        except Exception as err:  # a value Airflow cannot read as a boolean: the plugin stays off too
            return False, f"Airflow's configuration ({type(err).__name__}: {err})"
    if plugin.OPT_IN_ENV in os.environ:  # Airflow: the environment variable wins over airflow.cfg
        return _airflow_boolean(os.environ[plugin.OPT_IN_ENV], plugin.OPT_IN_ENV)
    path = airflow_cfg_file()
    if not os.path.isfile(path):
        return False, f"{plugin.OPT_IN_ENV} (unset) and {path} (no such file)"
    import configparser

    # Airflow's own parser: keys lower-cased, duplicate keys allowed (the last wins)
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, OSError, UnicodeDecodeError) as err:
        return False, f"{path} (cannot be read: {type(err).__name__}: {err})"
    value = parser.get(plugin.OPT_IN_SECTION, plugin.OPT_IN_KEY, fallback=None)
    if value is None:
        return False, f"{plugin.OPT_IN_ENV} (unset) and {path} (not set there)"
    return _airflow_boolean(value, path)


def airflow_cfg_file() -> str:
    """The airflow.cfg that Airflow reads: ``$AIRFLOW_CONFIG``, else ``$AIRFLOW_HOME/airflow.cfg``
    (AIRFLOW_HOME defaults to ~/airflow), with variables and ~ expanded as Airflow does."""

    def expand(value: str) -> str:
        while True:  # airflow.configuration.expand_env_var: until nothing changes
            expanded = os.path.expanduser(os.path.expandvars(value))
            if expanded == value:
                return value
            value = expanded

    if os.environ.get("AIRFLOW_CONFIG"):
        return expand(os.environ["AIRFLOW_CONFIG"])
    return os.path.join(expand(os.environ.get("AIRFLOW_HOME", "~/airflow")), "airflow.cfg")


def _airflow_boolean(value: str, read_from: str) -> tuple[bool, str]:
    """``value`` as Airflow's ``conf.getboolean`` reads it; one it cannot read leaves the plugin
    off in Airflow too (its plugin route logs a WARNING), so: off, and why."""
    text = value.lower().strip().split("#")[0].strip()
    if text in ("t", "true", "1"):
        return True, read_from
    if text in ("f", "false", "0"):
        return False, read_from
    return False, f"{read_from} (not a boolean: {value!r}; Airflow's plugin route fails on it)"


def plugin_entry_point() -> str | None:
    """This package's ``airflow.plugins`` entry point as installed (None: not in its metadata)."""
    from importlib.metadata import entry_points

    found = entry_points()
    # Python 3.10+ selects by group; 3.9 returns a dict of groups
    group = (
        found.select(group="airflow.plugins")
        if hasattr(found, "select")
        else found.get("airflow.plugins", ())
    )
    for entry_point in group:
        if entry_point.value.startswith("airflow_dataset_race_fix."):
            return f"{entry_point.name} = {entry_point.value}"
    return None
