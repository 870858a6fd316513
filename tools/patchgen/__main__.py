"""
Regenerate ``patches/`` (the series and ``verified-releases``) from ``src/.../fix/``:

    python -m tools.patchgen [--check] [--airflow-version V ...] [--patches-dir DIR] [--wheel-cache DIR]

from the root of a clone, with the package installed (``pip install -e .``).
Exit codes: 0 up to date (or written), 1 not up to date (``--check``) or the fix does
not fit a release, 2 bad usage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from airflow_dataset_race_fix.targets import SUPPORTED_AIRFLOW_VERSIONS
from tools.patchgen import generator, wheels

REPO = Path(__file__).resolve().parents[2]
COMMAND = "python -m tools.patchgen"


def generate(
    patches_dir: Path | None, versions: list[str] | None, check: bool, wheel_cache: Path | None
) -> int:
    patches_dir = patches_dir or REPO / "patches"
    versions = versions or list(SUPPORTED_AIRFLOW_VERSIONS)
    unknown = [v for v in versions if v not in SUPPORTED_AIRFLOW_VERSIONS]
    if unknown:
        print(
            f"{COMMAND}: not a supported version: {', '.join(unknown)} "
            "(see targets.SUPPORTED_AIRFLOW_VERSIONS)",
            file=sys.stderr,
        )
        return 2
    ordered = [v for v in SUPPORTED_AIRFLOW_VERSIONS if v in versions]  # the newest last: the series' base
    releases = {v: wheels.release_files(v, generator.target_paths(), wheel_cache).files for v in ordered}
    try:
        files = generator.render(releases, patches_dir)
    except generator.GenerationError as err:
        print(f"{COMMAND}: {err}", file=sys.stderr)
        return 1
    if check:
        problems = generator.differences(patches_dir, files)
        for problem in problems:
            print(problem)
        if problems:
            print(f"patches/ is not up to date: run '{COMMAND}'", file=sys.stderr)
            return 1
    else:
        for line in generator.write(patches_dir, files):
            print(line)
    print(f"patches/ is up to date, verified against {', '.join(ordered)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.strip().split("\n\n")[0])
    parser.add_argument("--patches-dir", type=Path, help=f"default: {REPO / 'patches'}")
    parser.add_argument(
        "--airflow-version",
        action="append",
        dest="versions",
        metavar="VERSION",
        help="verify and record only these releases, the series made from the newest "
        "(default: all supported)",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if patches/ is not up to date"
    )
    parser.add_argument(
        "--wheel-cache",
        type=Path,
        help="default: $ADRF_WHEEL_CACHE or ~/.cache/airflow-dataset-race-fix/wheels",
    )
    args = parser.parse_args(argv)
    return generate(args.patches_dir, args.versions, args.check, args.wheel_cache)


if __name__ == "__main__":
    sys.exit(main())
