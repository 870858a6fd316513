"""``shim``: the start-up shim's routes: ``path`` (for PYTHONPATH), ``install-pth``, ``remove-pth``."""

from __future__ import annotations

import os

from airflow_dataset_race_fix.cli import UsageError


def register(subparsers) -> None:
    parser = subparsers.add_parser("shim", help="activate or deactivate the start-up shim (PYTHONPATH, .pth)")
    actions = parser.add_subparsers(dest="shim_action", metavar="ACTION")
    actions.add_parser("path", help="print the directory to put on PYTHONPATH").set_defaults(handler=_path)
    install = actions.add_parser(
        "install-pth", help="write the .pth file that starts the shim in every interpreter"
    )
    install.add_argument("--site-dir", help="site-packages directory (default: this interpreter's)")
    install.set_defaults(handler=_install)
    remove = actions.add_parser("remove-pth", help="delete the .pth file")
    remove.add_argument(
        "--site-dir", help="site-packages directory (default: every one this interpreter reads)"
    )
    remove.set_defaults(handler=_remove)
    parser.set_defaults(handler=lambda args: parser.print_help() or 2)


def _path(args) -> int:
    from airflow_dataset_race_fix import BOOTSTRAP_DIR

    print(BOOTSTRAP_DIR)
    return 0


def _checked_site_dir(site_dir: str | None) -> str | None:
    if site_dir is not None and not os.path.isdir(site_dir):
        raise UsageError(f"--site-dir {site_dir!r} is not a directory")
    return site_dir


def _install(args) -> int:
    from airflow_dataset_race_fix import activation

    path, changed = activation.install_pth(_checked_site_dir(args.site_dir))
    print(f"{'installed' if changed else 'already installed'}: {path}")
    print(
        "New Python processes of this environment start the shim; check with "
        "'airflow-dataset-race-fix status'."
    )
    print(
        "Before 'pip uninstall airflow-dataset-race-fix', run 'airflow-dataset-race-fix shim remove-pth': "
        "pip leaves this file behind (it then does nothing, silently; delete it any time)."
    )
    return 0


def _remove(args) -> int:
    from airflow_dataset_race_fix import activation

    removed = activation.remove_pth(_checked_site_dir(args.site_dir))
    for path in removed:
        print(f"removed: {path}")
    if not removed:
        print("no .pth file of airflow-dataset-race-fix found; nothing to remove")
    return 0
