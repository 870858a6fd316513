"""
How the shim is (or can be) activated in an environment: PYTHONPATH, a ``.pth`` file.

Used by ``status`` and ``shim install-pth`` / ``remove-pth``; never at interpreter start.

The ``.pth`` route exists for images where PYTHONPATH is awkward (it is reset by a
wrapper, or a distribution sitecustomize must stay first). ``site`` executes a ``.pth``
line that starts with ``import`` for every interpreter using that site-packages
directory, so the line must be cheap and silent when this package is gone (``pip
uninstall`` does not remove a file it did not install).
"""

from __future__ import annotations

import os
import sys
import sysconfig
import tempfile

from airflow_dataset_race_fix import BOOTSTRAP_DIR

PTH_FILENAME = "airflow_dataset_race_fix_shim.pth"
PTH_LINE = (
    "import sys; exec(\"try:\\n import airflow_dataset_race_fix.bootstrap as _adrf\\n"
    "except ImportError:\\n pass\\nelse:\\n _adrf.start_quietly(_adrf.ROUTE_PTH)\")\n"
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
    return [e for e in environ.get("PYTHONPATH", "").split(os.pathsep) if e and _same_directory(e, BOOTSTRAP_DIR)]


def site_directories() -> list[str]:
    """The directories whose ``.pth`` files this interpreter processes (or would, without -S)."""
    import site

    directories = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        directories.append(site.getusersitepackages())
    return list(dict.fromkeys(directories))


def installed_pth_files() -> list[str]:
    return [
        os.path.join(d, PTH_FILENAME) for d in site_directories() if os.path.isfile(os.path.join(d, PTH_FILENAME))
    ]


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
    # A half-written .pth would be executed by every interpreter starting meanwhile.
    fd, tmp = tempfile.mkstemp(prefix=".adrf-", suffix=".tmp", dir=site_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(PTH_CONTENT)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
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
